// The TcpStore wire format, shared by the client (tcp_store.cc), the server
// (tcp_store_server.cc) and the fuzz test. Integers are little-endian host order (both ends run
// the same binary family).
//
//   request: type u8 | key_len u32 | key | value_len u64 | value
//   reply:   'O' (ok) or 'E' (error) u8 | len u64 | payload (value, number or error message)
//
// Requests: 'H' hello (key: the job's token, value: "rank world_size"; must come first),
// 'S' set, 'G' get (answered once the key exists), 'A' add (value: decimal delta; reply: the new
// decimal total), 'W' wait (like get, empty reply), 'C' check (reply "1" if the key exists, else
// "0"). A connection handles one request at a time, in order.
#ifndef SHARDMAP_COLLECTIVES_TCP_STORE_WIRE_H_
#define SHARDMAP_COLLECTIVES_TCP_STORE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace shardmap::collectives::wire {

// Bounds on what one connection can make the server hold.
inline constexpr uint32_t kMaxKey = 4096;
inline constexpr uint64_t kMaxValue = uint64_t{16} << 20;
inline constexpr size_t kRequestHeader = 1 + 4 + 8;  // type, key_len, value_len
inline constexpr size_t kReplyHeader = 1 + 8;
// Unauthenticated connections held at once; more are closed at accept.
inline constexpr int kMaxUnauthenticated = 64;

inline bool IsRequestType(char t) {
  return t == 'H' || t == 'S' || t == 'G' || t == 'A' || t == 'W' || t == 'C';
}

inline std::string Request(char type, absl::string_view key, absl::string_view value) {
  std::string f(1, type);
  const uint32_t kl = static_cast<uint32_t>(key.size());
  const uint64_t vl = value.size();
  f.append(reinterpret_cast<const char*>(&kl), 4);
  f.append(key.data(), key.size());
  f.append(reinterpret_cast<const char*>(&vl), 8);
  f.append(value.data(), value.size());
  return f;
}

inline std::string Reply(bool ok, absl::string_view payload) {
  std::string f(1, ok ? 'O' : 'E');
  const uint64_t l = payload.size();
  f.append(reinterpret_cast<const char*>(&l), 8);
  f.append(payload.data(), payload.size());
  return f;
}

}  // namespace shardmap::collectives::wire

#endif  // SHARDMAP_COLLECTIVES_TCP_STORE_WIRE_H_
