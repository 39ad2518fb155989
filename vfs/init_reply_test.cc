#include "vfs/init_reply.h"

#include <gtest/gtest.h>
#include <linux/fuse.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>

namespace fleetfs::vfs {
namespace {

std::string InitRequest(std::uint64_t unique, std::uint32_t flags, std::uint32_t flags2 = 0) {
  fuse_in_header in{};
  in.opcode = FUSE_INIT;
  in.unique = unique;
  fuse_init_in init{};
  init.major = 7;
  init.minor = 31;
  init.flags = flags;
  init.flags2 = flags2;
  in.len = sizeof(in) + sizeof(init);
  std::string bytes(reinterpret_cast<const char*>(&in), sizeof(in));
  bytes.append(reinterpret_cast<const char*>(&init), sizeof(init));
  return bytes;
}

constexpr std::uint32_t kUring2 = static_cast<std::uint32_t>(InitReplyPatch::kOverIoUring >> 32);

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

fuse_init_out InitOf(const std::string& message) {
  fuse_init_out init;
  std::memcpy(&init, message.data() + sizeof(fuse_out_header), sizeof(init));
  return init;
}
std::uint32_t FlagsOf(const std::string& message) { return InitOf(message).flags; }

TEST(InitReplyPatch, the_answer_to_init_gets_the_flag_when_the_kernel_offered_it) {
  InitReplyPatch p;
  std::string req = InitRequest(2, FUSE_PARALLEL_DIROPS | FUSE_ASYNC_READ);
  p.SawRequest(req.data(), req.size());
  Reply reply(2, FUSE_ASYNC_READ | FUSE_BIG_WRITES);
  std::string scratch;
  ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch));
  EXPECT_EQ(scratch.size(), sizeof(fuse_out_header) + sizeof(fuse_init_out));
  EXPECT_EQ(FlagsOf(scratch), FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_PARALLEL_DIROPS);
  EXPECT_TRUE(p.dirops_applied());
  // The libfuse buffer itself is left as it was.
  EXPECT_EQ(reply.init.flags, FUSE_ASYNC_READ | FUSE_BIG_WRITES);
}

TEST(InitReplyPatch, nothing_is_added_that_the_kernel_did_not_offer) {
  InitReplyPatch p;
  std::string req = InitRequest(2, FUSE_ASYNC_READ);
  p.SawRequest(req.data(), req.size());
  Reply reply(2, FUSE_ASYNC_READ);
  std::string scratch;
  EXPECT_FALSE(p.Patch(reply.iov, 2, &scratch));
  EXPECT_FALSE(p.dirops_applied());
}

TEST(InitReplyPatch, other_answers_and_an_init_error_pass_untouched) {
  InitReplyPatch p;
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
  InitReplyPatch q;
  q.SawRequest(req.data(), sizeof(fuse_in_header));
  Reply init(2, 0);
  EXPECT_FALSE(q.Patch(init.iov, 2, &scratch));
}

TEST(InitReplyPatch, the_flag_is_added_once) {
  InitReplyPatch p;
  std::string req = InitRequest(9, FUSE_PARALLEL_DIROPS);
  p.SawRequest(req.data(), req.size());
  Reply reply(9, 0);
  std::string scratch;
  ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch));
  EXPECT_FALSE(p.Patch(reply.iov, 2, &scratch));
}

TEST(InitReplyPatch, io_uring_is_announced_when_asked_for_and_offered_with_the_payload_size) {
  InitReplyPatch p;
  p.AskForUring(true);
  std::string req = InitRequest(4, FUSE_INIT_EXT | FUSE_MAX_PAGES, kUring2);
  p.SawRequest(req.data(), req.size());
  EXPECT_TRUE(p.uring_offered());
  Reply reply(4, FUSE_ASYNC_READ | FUSE_MAX_PAGES);
  reply.init.max_write = 1 << 20;
  reply.init.max_pages = 256;
  std::string scratch;
  ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch));
  fuse_init_out init = InitOf(scratch);
  EXPECT_EQ(init.flags, FUSE_ASYNC_READ | FUSE_MAX_PAGES | FUSE_INIT_EXT)
      << "flags2 is read only behind FUSE_INIT_EXT";
  EXPECT_EQ(init.flags2, kUring2);
  EXPECT_TRUE(p.uring_announced());
  EXPECT_FALSE(p.dirops_applied()) << "parallel lookups were not offered";
  EXPECT_EQ(p.uring_payload_size(), std::size_t{1} << 20);
}

TEST(InitReplyPatch, the_payload_is_the_largest_of_max_write_max_pages_and_the_floor) {
  for (auto [flags, max_write, max_pages, want] :
       {std::tuple<std::uint32_t, std::uint32_t, std::uint16_t, std::size_t>{0, 4096, 0, 32 * 4096},
        {FUSE_MAX_PAGES, 4096, 1, 8192},
        {FUSE_MAX_PAGES, 300000, 2, 300000},
        {FUSE_MAX_PAGES, 0, 0, 8192}}) {
    InitReplyPatch p;
    p.AskForUring(true);
    std::string req = InitRequest(4, FUSE_INIT_EXT, kUring2);
    p.SawRequest(req.data(), req.size());
    Reply reply(4, flags);
    reply.init.max_write = max_write;
    reply.init.max_pages = max_pages;
    std::string scratch;
    ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch));
    EXPECT_EQ(p.uring_payload_size(), want) << max_write << " " << max_pages;
  }
}

TEST(InitReplyPatch, io_uring_is_not_announced_unless_both_asked_for_and_offered) {
  for (auto [ask, flags2] : {std::pair{false, kUring2}, std::pair{true, 0u}}) {
    InitReplyPatch p;
    p.AskForUring(ask);
    std::string req = InitRequest(4, FUSE_INIT_EXT | FUSE_PARALLEL_DIROPS, flags2);
    p.SawRequest(req.data(), req.size());
    Reply reply(4, FUSE_ASYNC_READ);
    std::string scratch;
    ASSERT_TRUE(p.Patch(reply.iov, 2, &scratch)) << "parallel lookups still go in";
    EXPECT_EQ(InitOf(scratch).flags2, 0u);
    EXPECT_EQ(FlagsOf(scratch), FUSE_ASYNC_READ | FUSE_PARALLEL_DIROPS);
    EXPECT_FALSE(p.uring_announced());
  }
  // flags2 is not read without FUSE_INIT_EXT.
  InitReplyPatch p;
  p.AskForUring(true);
  std::string req = InitRequest(4, 0, kUring2);
  p.SawRequest(req.data(), req.size());
  EXPECT_FALSE(p.uring_offered());
}

}  // namespace
}  // namespace fleetfs::vfs
