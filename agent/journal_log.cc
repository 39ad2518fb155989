#include "agent/journal_log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace fleetfs::agent {
namespace {

// "<N>" before the message: journald takes it as the line's priority.
class PriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string prefix = "<" + std::to_string(JournalPriority(msg.level)) + ">";
    dest.append(prefix.data(), prefix.data() + prefix.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityFlag>();
  }
};

template <typename T>
bool ParseDecimal(std::string_view text, T& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

LogTarget LogTargetFor(const char* journal_stream, std::optional<FileId> stderr_id) {
  if (journal_stream == nullptr || !stderr_id) return LogTarget::kStream;
  const std::string_view value(journal_stream);
  const std::size_t colon = value.find(':');
  if (colon == std::string_view::npos) return LogTarget::kStream;
  unsigned long long dev = 0, ino = 0;
  if (!ParseDecimal(value.substr(0, colon), dev) || !ParseDecimal(value.substr(colon + 1), ino)) {
    return LogTarget::kStream;
  }
  return dev == static_cast<unsigned long long>(stderr_id->dev) &&
                 ino == static_cast<unsigned long long>(stderr_id->ino)
             ? LogTarget::kJournal
             : LogTarget::kStream;
}

LogTarget DetectLogTarget() {
  std::optional<FileId> id;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) == 0) id = FileId{st.st_dev, st.st_ino};
  return LogTargetFor(std::getenv("JOURNAL_STREAM"), id);
}

std::string_view LogPattern(LogTarget target) {
  return target == LogTarget::kJournal ? "%*%v" : "%Y-%m-%dT%H:%M:%S.%e %l %v";
}

int JournalPriority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::critical: return 2;
    case spdlog::level::err: return 3;
    case spdlog::level::warn: return 4;
    case spdlog::level::info: return 6;
    default: return 7;  // debug, trace
  }
}

void ConfigureLogFormat(spdlog::logger& logger, LogTarget target) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<PriorityFlag>('*').set_pattern(std::string(LogPattern(target)));
  logger.set_formatter(std::move(formatter));
}

std::string StderrLine(LogTarget target, spdlog::level::level_enum level, std::string_view text) {
  std::string line;
  if (target == LogTarget::kJournal) line = "<" + std::to_string(JournalPriority(level)) + ">";
  line.append(text);
  line += '\n';
  return line;
}

}  // namespace fleetfs::agent
