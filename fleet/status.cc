#include "fleet/status.h"

#include <cstring>
#include <string>

namespace fleetfs {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kNotFound: return "not_found";
    case Code::kAlreadyExists: return "already_exists";
    case Code::kFailedPrecondition: return "failed_precondition";
    case Code::kUnavailable: return "unavailable";
    case Code::kDeadlineExceeded: return "deadline_exceeded";
    case Code::kDataLoss: return "data_loss";
    case Code::kIoError: return "io_error";
    case Code::kInternal: return "internal";
  }
  return "unknown";
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status ErrnoStatus(std::string_view what, int err) {
  return Status(Code::kIoError, std::string(what) + ": " + std::strerror(err));
}

}  // namespace fleetfs
