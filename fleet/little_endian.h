// Fixed-width integers in the replica's byte formats: little-endian, as the
// hosts fleetfs runs on (x86-64, arm64) hold them, so a copy is the encoding.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace fleetfs {

// Appends `v`'s bytes to `out`.
template <typename T>
void PutLittleEndian(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// The value at `in[at]`; the caller has checked that sizeof(T) bytes are there.
template <typename T>
T GetLittleEndian(std::string_view in, std::size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

}  // namespace fleetfs
