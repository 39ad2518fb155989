// Routing slots: which of the 16384 slots a routing key belongs to.
//
// The slot of a key is exactly Redis Cluster's HASH_SLOT: CRC16 (XMODEM:
// polynomial 0x1021, initial value 0, no reflection) of the key, mod 16384,
// hashing only the part inside the first "{...}" when that part is not empty.
// `redis-cli CLUSTER KEYSLOT <key>` agrees for every key (a test checks it).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace fleetfs {

using Slot = std::uint16_t;

inline constexpr Slot kSlotCount = 16384;
inline constexpr Slot kLastSlot = kSlotCount - 1;

// A bucket is a directory of 64 slots: slot / 64, written as three digits.
inline constexpr Slot kSlotsPerBucket = 64;
inline constexpr int kBucketCount = kSlotCount / kSlotsPerBucket;  // 256

// CRC16/XMODEM of `bytes`.
std::uint16_t Crc16(std::string_view bytes);

// The part of `key` that is hashed: the text between the first '{' and the
// first '}' after it, when that text is not empty; otherwise the whole key.
std::string_view HashTag(std::string_view key);

// The slot of a routing key (any bytes).
Slot KeySlot(std::string_view key);

inline int BucketOf(Slot slot) { return slot / kSlotsPerBucket; }

}  // namespace fleetfs
