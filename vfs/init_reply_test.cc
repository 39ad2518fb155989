#include "vfs/init_reply.h"

#include <gtest/gtest.h>
#include <linux/fuse.h>

#include <cstring>
#include <string>

namespace fleetfs::vfs {
namespace {

std::string InitRequest(std::uint64_t unique, std::uint32_t flags) {
  fuse_in_header in{};
  in.opcode = FUSE_INIT;
  in.unique = unique;
  fuse_init_in init{};
  init.major = 7;
  init.minor = 31;
  init.flags = flags;
  in.len = sizeof(in) + sizeof(init);
  std::string bytes(reinterpret_cast<const char*>(&in), sizeof(in));
  bytes.append(reinterpret_cast<const char*>(&init), sizeof(init));
  return bytes;
}

struct Reply {
  fuse_out_header header{};
  fuse_init_out init{};
  iovec iov[2];
  Reply(std::uint64_t unique, std::uint32_t flags, std::int32_t error = 0) {
    header.unique = unique;
    header.error = error;
    header.len = sizeof(header) + sizeof(init);
    init.major = 7;
    init.flags = flags;
    iov[0] = {&header, sizeof(header)};
    iov[1] = {&init, sizeof(init)};
  }
};

std::uint32_t FlagsOf(const std::string& message) {
  fuse_init_out init;
  std::memcpy(&init, message.data() + sizeof(fuse_out_header), sizeof(init));
  return init.flags;
}

TEST(ParallelDirops, the_answer_to_init_gets_the_flag_when_the_kernel_offered_it) {
  ParallelDirops p;
  std::string req = InitRequest(2, FUSE_PARALLEL_DIROPS | FUSE_ASYNC_READ);
  p.SawRequest(req.data(), req.size());
  Reply reply(2, FUSE_ASYNC_READ | FUSE_BIG_WRITES);
  std::string scratch;
  ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch));
  EXPECT_EQ(scratch.size(), sizeof(fuse_out_header) + sizeof(fuse_init_out));
  EXPECT_EQ(FlagsOf(scratch), FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_PARALLEL_DIROPS);
  EXPECT_TRUE(p.applied());
  // The libfuse buffer itself is left as it was.
  EXPECT_EQ(reply.init.flags, FUSE_ASYNC_READ | FUSE_BIG_WRITES);
}

TEST(ParallelDirops, nothing_is_added_that_the_kernel_did_not_offer) {
  ParallelDirops p;
  std::string req = InitRequest(2, FUSE_ASYNC_READ);
  p.SawRequest(req.data(), req.size());
  Reply reply(2, FUSE_ASYNC_READ);
  std::string scratch;
  EXPECT_FALSE(p.Patch(reply.iov, 2, &scratch));
  EXPECT_FALSE(p.applied());
}

TEST(ParallelDirops, other_answers_and_an_init_error_pass_untouched) {
  ParallelDirops p;
  std::string scratch;
  Reply before(2, 0);
  EXPECT_FALSE(p.Patch(before.iov, 2, &scratch)) << "patched with no INIT seen";
  std::string req = InitRequest(2, FUSE_PARALLEL_DIROPS);
  p.SawRequest(req.data(), req.size());
  Reply other(3, 0);
  EXPECT_FALSE(p.Patch(other.iov, 2, &scratch));
  Reply refused(2, 0, -EPROTO);
  EXPECT_FALSE(p.Patch(refused.iov, 1, &scratch));
  // A short read is ignored, not read past.
  ParallelDirops q;
  q.SawRequest(req.data(), sizeof(fuse_in_header));
  Reply init(2, 0);
  EXPECT_FALSE(q.Patch(init.iov, 2, &scratch));
}

TEST(ParallelDirops, the_flag_is_added_once) {
  ParallelDirops p;
  std::string req = InitRequest(9, FUSE_PARALLEL_DIROPS);
  p.SawRequest(req.data(), req.size());
  Reply reply(9, 0);
  std::string scratch;
  ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch));
  EXPECT_FALSE(p.Patch(reply.iov, 2, &scratch));
}

}  // namespace
}  // namespace fleetfs::vfs
