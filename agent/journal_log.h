// How the agent's log lines look: with a time stamp on a terminal or a file,
// and journald's way when stderr is the journal. journald stamps every line
// itself and reads a leading "<N>" as the line's priority (sd-daemon(3)), so
// there the agent drops its own stamp (journalctl would show two) and puts
// the level where `journalctl -p` filters on it.
//
// Thread-safety: pure functions, plus DetectLogTarget, which reads the
// environment and fstat(2)s stderr.
#pragma once

#include <spdlog/common.h>
#include <spdlog/logger.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace fleetfs::agent {

enum class LogTarget { kStream, kJournal };

// The device and inode of an open file, as fstat(2) gives them.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
};

// systemd sets JOURNAL_STREAM to "DEV:INO" of the stream it connected to the
// journal. Children inherit the variable even when their stderr is
// redirected (`fleetfs mount 2>log` from a shell in a unit), so it counts
// only when it names the stderr this process has. `journal_stream` may be
// null (unset); `stderr_id` is nullopt when stderr is closed.
LogTarget LogTargetFor(const char* journal_stream, std::optional<FileId> stderr_id);
// LogTargetFor of this process's JOURNAL_STREAM and stderr.
LogTarget DetectLogTarget();

// The spdlog pattern for a target. For the journal: "%*" is the priority
// flag that ConfigureLogFormat registers, then the message, no time stamp.
std::string_view LogPattern(LogTarget target);
// sd-daemon's priority of a level: <3> error, <4> warning, <6> info, <7> debug.
int JournalPriority(spdlog::level::level_enum level);
// Sets `logger`'s format for `target`.
void ConfigureLogFormat(spdlog::logger& logger, LogTarget target);
// One line the agent writes to stderr without its logger (a start failure,
// which the "fleetfs: " form keeps for scripts and terminals), newline
// included: journald files a line without "<N>" at the unit's default
// priority, info, where `journalctl -p err` does not look.
std::string StderrLine(LogTarget target, spdlog::level::level_enum level, std::string_view text);

}  // namespace fleetfs::agent
