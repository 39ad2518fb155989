// What every fuzz target uses to state a property: FUZZ_CHECK(cond, what)
// aborts with a message when `cond` is false, so libFuzzer saves the input
// and reports it as a crash. (assert() is compiled out in RelWithDebInfo.)
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond, what)                                                               \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: property failed: %s\n  (%s)\n", __FILE__, __LINE__, what, \
                   #cond);                                                                   \
      std::abort();                                                                          \
    }                                                                                        \
  } while (false)

namespace fleetfs::fuzz {

inline std::string_view AsText(const unsigned char* data, std::size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace fleetfs::fuzz
