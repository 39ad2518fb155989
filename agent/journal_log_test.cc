#include "agent/journal_log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/ostream_sink.h>

#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace fleetfs::agent {
namespace {

constexpr FileId kStderr{0x803, 1234567};

TEST(LogTargetTest, journal_stream_naming_our_stderr_means_the_journal) {
  EXPECT_EQ(LogTargetFor("2051:1234567", kStderr), LogTarget::kJournal);
}

TEST(LogTargetTest, no_journal_stream_means_a_plain_stream) {
  EXPECT_EQ(LogTargetFor(nullptr, kStderr), LogTarget::kStream);
}

TEST(LogTargetTest, a_journal_stream_inherited_by_a_redirected_stderr_is_ignored) {
  EXPECT_EQ(LogTargetFor("2051:7654321", kStderr), LogTarget::kStream);
  EXPECT_EQ(LogTargetFor("9:1234567", kStderr), LogTarget::kStream);
}

TEST(LogTargetTest, a_malformed_journal_stream_or_a_closed_stderr_means_a_plain_stream) {
  for (const char* bad : {"", ":", "2051", "2051:", ":1234567", "2051:1234567x", "x2051:1234567",
                          "-2051:1234567", "2051:1234567:1"}) {
    EXPECT_EQ(LogTargetFor(bad, kStderr), LogTarget::kStream) << "'" << bad << "'";
  }
  EXPECT_EQ(LogTargetFor("2051:1234567", std::nullopt), LogTarget::kStream);
}

TEST(JournalPriorityTest, levels_map_to_sd_daemon_priorities) {
  EXPECT_EQ(JournalPriority(spdlog::level::critical), 2);
  EXPECT_EQ(JournalPriority(spdlog::level::err), 3);
  EXPECT_EQ(JournalPriority(spdlog::level::warn), 4);
  EXPECT_EQ(JournalPriority(spdlog::level::info), 6);
  EXPECT_EQ(JournalPriority(spdlog::level::debug), 7);
  EXPECT_EQ(JournalPriority(spdlog::level::trace), 7);
}

std::string LogThrough(LogTarget target) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::logger logger("test", sink);
  ConfigureLogFormat(logger, target);
  logger.error("store down");
  logger.warn("range 0-99: lost");
  logger.info("mounted /mnt/fleet");
  return out.str();
}

TEST(ConfigureLogFormatTest, for_the_journal_lines_carry_the_priority_and_no_time_stamp) {
  EXPECT_EQ(LogThrough(LogTarget::kJournal),
            "<3>store down\n<4>range 0-99: lost\n<6>mounted /mnt/fleet\n");
}

TEST(ConfigureLogFormatTest, for_a_stream_lines_carry_a_time_stamp_and_the_level) {
  const std::string text = LogThrough(LogTarget::kStream);
  const std::regex line(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (error|warning|info) [^\n]+\n)");
  std::string rest = text;
  int lines = 0;
  std::smatch m;
  while (std::regex_search(rest, m, line, std::regex_constants::match_continuous)) {
    rest = m.suffix();
    ++lines;
  }
  EXPECT_EQ(lines, 3) << text;
  EXPECT_EQ(rest, "") << text;
}

TEST(StderrLineTest, carries_the_priority_only_for_the_journal) {
  EXPECT_EQ(StderrLine(LogTarget::kJournal, spdlog::level::err, "fleetfs: store down"),
            "<3>fleetfs: store down\n");
  EXPECT_EQ(StderrLine(LogTarget::kStream, spdlog::level::err, "fleetfs: store down"),
            "fleetfs: store down\n");
}

}  // namespace
}  // namespace fleetfs::agent
