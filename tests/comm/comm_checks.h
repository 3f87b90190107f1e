#pragma once
// Backend-agnostic checks of the Communicator contract (communicator.h).
//
// Each check runs on every rank of one world (threads or MPI processes) and
// reports through gtest EXPECT/ASSERT. Every rank calls the same checks in
// the same order. A check that fails on one rank may leave the others
// waiting: they then fail with the communicator's timeout, so keep it short
// in tests. Every check works for any world size >= 1 (checks that need two
// ranks do nothing on a world of one).

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sparsecomm/comm/communicator.h"
#include "sparsecomm/comm/typed.h"
#include "sparsecomm/core/errors.h"

namespace sparsecomm::checks {

// Byte i of the message that `a` sends to `b` (or of block `a` of a
// collective): depends on every argument, so a message delivered to the
// wrong place or in the wrong order shows up as a difference.
inline std::byte pattern_byte(int a, int b, std::size_t i) {
  const std::size_t mixed =
      static_cast<std::size_t>(a) * 131 + static_cast<std::size_t>(b) * 31 + i * 7 + (i >> 8) * 13;
  return static_cast<std::byte>(mixed & 0xffu);
}

inline std::vector<std::byte> pattern(int a, int b, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = pattern_byte(a, b, i);
  return out;
}

// A buffer to receive into, filled with a value the patterns rarely produce
// in long runs.
inline std::vector<std::byte> garbage(std::size_t bytes) {
  return std::vector<std::byte>(bytes, std::byte{0xee});
}

// Equal sizes and bytes; on failure names the first differing byte.
inline ::testing::AssertionResult same_bytes(std::span<const std::byte> got,
                                             std::span<const std::byte> want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " bytes, want " << want.size();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure()
             << "first difference at byte " << i << " of " << got.size() << ": got "
             << std::to_integer<int>(got[i]) << ", want " << std::to_integer<int>(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Expects `fn` to throw InvalidArgument whose message contains `needle`.
inline void expect_invalid_argument(const std::function<void()>& fn, const std::string& needle,
                                    const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << what << ": no exception, expected InvalidArgument mentioning '" << needle
                  << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": message '" << e.what() << "' does not mention '" << needle << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": expected InvalidArgument, got: " << e.what();
  }
}

// Every rank sends to rank+1 and receives from rank-1 (itself on a world of
// one), from 0 bytes to well above any eager limit.
inline void check_ring_exchange(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  for (const std::size_t bytes : {0u, 1u, 1000u, 70000u, 1u << 20}) {
    const std::vector<std::byte> out = pattern(r, next, bytes);
    std::vector<std::byte> in = garbage(bytes);
    Request incoming = comm.irecv(in, prev, 7);
    Request outgoing = comm.isend(out, next, 7);
    incoming.wait();
    outgoing.wait();
    EXPECT_TRUE(same_bytes(in, pattern(prev, r, bytes)))
        << "rank " << r << " receiving " << bytes << " bytes from rank " << prev;
  }
}

// Several messages from one source with one tag arrive in send order, both
// when the receives are posted after the sends and before them.
inline void check_ordering_per_source_and_tag(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  const std::vector<std::size_t> sizes = {8, 0, 100000, 3, 70000, 8, 1};
  const auto message_id = [](int rank, std::size_t i) { return rank * 100 + static_cast<int>(i); };

  for (const bool receives_first : {false, true}) {
    const int tag = receives_first ? 12 : 11;
    std::vector<std::vector<std::byte>> out(sizes.size());
    std::vector<std::vector<std::byte>> in(sizes.size());
    std::vector<Request> receives;
    std::vector<Request> sends;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      out[i] = pattern(message_id(r, i), next, sizes[i]);
      in[i] = garbage(sizes[i]);
    }
    if (receives_first) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        receives.push_back(comm.irecv(in[i], prev, tag));
      }
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) sends.push_back(comm.isend(out[i], next, tag));
    if (receives_first) {
      for (Request& request : receives) request.wait();
    } else {
      for (std::size_t i = 0; i < sizes.size(); ++i) comm.recv(in[i], prev, tag);
    }
    for (Request& request : sends) request.wait();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(same_bytes(in[i], pattern(message_id(prev, i), r, sizes[i])))
          << "rank " << r << ", message " << i << " from rank " << prev
          << (receives_first ? " (receives posted first)" : " (sends first)");
    }
  }
}

// A receive for a later tag completes while an earlier message with another
// tag is still unreceived; messages from different sources with one tag do
// not mix.
inline void check_tags_out_of_order(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  struct Case {
    int first_tag;
    std::size_t first_bytes;
    int second_tag;
    std::size_t second_bytes;
  };
  for (const Case& c : {Case{21, 100000, 22, 16}, Case{23, 16, 24, 100000}, Case{25, 5, 26, 0}}) {
    const std::vector<std::byte> first = pattern(r * 10 + 1, next, c.first_bytes);
    const std::vector<std::byte> second = pattern(r * 10 + 2, next, c.second_bytes);
    Request sent_first = comm.isend(first, next, c.first_tag);
    Request sent_second = comm.isend(second, next, c.second_tag);
    std::vector<std::byte> got_second = garbage(c.second_bytes);
    std::vector<std::byte> got_first = garbage(c.first_bytes);
    comm.recv(got_second, prev, c.second_tag);
    comm.recv(got_first, prev, c.first_tag);
    sent_first.wait();
    sent_second.wait();
    EXPECT_TRUE(same_bytes(got_second, pattern(prev * 10 + 2, r, c.second_bytes)))
        << "rank " << r << ", tag " << c.second_tag;
    EXPECT_TRUE(same_bytes(got_first, pattern(prev * 10 + 1, r, c.first_bytes)))
        << "rank " << r << ", tag " << c.first_tag;
  }

  if (n < 3) return;  // below, next and prev must differ
  const int tag = 27;
  const std::vector<std::byte> to_next = pattern(r, next, 3000);
  const std::vector<std::byte> to_prev = pattern(r, prev, 90000);
  Request a = comm.isend(to_next, next, tag);
  Request b = comm.isend(to_prev, prev, tag);
  std::vector<std::byte> from_next = garbage(90000);
  std::vector<std::byte> from_prev = garbage(3000);
  comm.recv(from_next, next, tag);
  comm.recv(from_prev, prev, tag);
  a.wait();
  b.wait();
  EXPECT_TRUE(same_bytes(from_next, pattern(next, r, 90000))) << "rank " << r << " from next";
  EXPECT_TRUE(same_bytes(from_prev, pattern(prev, r, 3000))) << "rank " << r << " from prev";
}

// Zero-byte messages (also with a null buffer) are delivered, in order with
// the non-empty ones of the same tag.
inline void check_zero_byte_messages(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  const std::vector<std::size_t> sizes = {0, 5, 0, 0, 9, 0};
  std::vector<std::vector<std::byte>> out(sizes.size());
  std::vector<Request> sends;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out[i] = pattern(r + static_cast<int>(i), next, sizes[i]);
    const std::span<const std::byte> data =
        sizes[i] == 0 ? std::span<const std::byte>() : std::span<const std::byte>(out[i]);
    sends.push_back(comm.isend(data, next, 31));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<std::byte> in = garbage(sizes[i]);
    const std::span<std::byte> buffer = sizes[i] == 0 ? std::span<std::byte>() : std::span(in);
    comm.recv(buffer, prev, 31);
    EXPECT_TRUE(same_bytes(in, pattern(prev + static_cast<int>(i), r, sizes[i])))
        << "rank " << r << ", message " << i;
  }
  for (Request& request : sends) request.wait();

  // Zero bytes to itself.
  Request self = comm.isend({}, r, 32);
  comm.recv({}, r, 32);
  self.wait();
}

// Receives `posted` bytes from `src` where the sender sent another size, and
// expects a CommError (not a timeout) that names both ranks.
inline void expect_size_mismatch(Communicator& comm, std::size_t posted, int src, int tag) {
  std::vector<std::byte> buffer = garbage(posted);
  try {
    comm.recv(buffer, src, tag);
    ADD_FAILURE() << "rank " << comm.rank() << ": a recv of " << posted << " bytes from rank "
                  << src << " matched a message of another size without an error";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "expected a size mismatch, got a timeout: " << e.what();
  } catch (const PeerFailure& e) {
    ADD_FAILURE() << "expected a size mismatch, got a peer failure: " << e.what();
  } catch (const CommError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(fmt::format("rank {}", comm.rank())), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("rank {}", src)), std::string::npos) << message;
  }
}

// A receive posted with the wrong size fails with a CommError naming both
// ranks: rank 0 sends 8 bytes where rank 1 posts 4, and rank 1 sends 4 where
// rank 0 posts 8. Only the receiving side is checked (a backend may fail the
// send as well, or complete it). Call it last in a test: afterwards only
// tags it did not use are known to be clean.
inline void check_size_mismatch_is_an_error(Communicator& comm) {
  if (comm.size() < 2 || comm.rank() > 1) return;
  const int r = comm.rank();
  const int peer = 1 - r;
  const std::vector<std::byte> out = pattern(r, peer, r == 0 ? 8 : 4);
  Request sent;
  try {
    sent = comm.isend(out, peer, r == 0 ? 41 : 42);
  } catch (const CommError&) {
    // The thread backend may detect the mismatch on the sending side.
  }
  expect_size_mismatch(comm, r == 0 ? 8 : 4, peer, r == 0 ? 42 : 41);
  try {
    sent.wait();
  } catch (const CommError&) {
  }
}

// Barriers in a row, and a barrier between a send and its receive: barrier
// traffic never mixes with user messages.
inline void check_barrier(Communicator& comm) {
  for (int i = 0; i < 20; ++i) comm.barrier();
  const int n = comm.size();
  const int r = comm.rank();
  const std::vector<std::byte> out = pattern(r, 51, 100);
  Request sent = comm.isend(out, (r + 1) % n, 51);
  comm.barrier();
  std::vector<std::byte> in = garbage(100);
  comm.recv(in, (r - 1 + n) % n, 51);
  sent.wait();
  comm.barrier();
  EXPECT_TRUE(same_bytes(in, pattern((r - 1 + n) % n, 51, 100))) << "rank " << r;
}

// Broadcast from every root at sizes from 0 bytes to 128 KiB and 3 bytes:
// a binomial tree below blocks of 16 KiB, a scatter and ring allgather of
// uneven blocks above (up to 8 ranks; broadcast_rule.h).
// `native`: the backend's native_broadcast instead of broadcast.
inline void check_broadcast_of(Communicator& comm, bool native) {
  const int r = comm.rank();
  for (int root = 0; root < comm.size(); ++root) {
    for (const std::size_t bytes : {0u, 1u, 7u, 4096u, 65537u, 131075u}) {
      std::vector<std::byte> data = r == root ? pattern(root, 77, bytes) : garbage(bytes);
      if (native) {
        comm.native_broadcast(data, root);
      } else {
        comm.broadcast(data, root);
      }
      EXPECT_TRUE(same_bytes(data, pattern(root, 77, bytes)))
          << "rank " << r << ", root " << root << ", " << bytes << " bytes";
    }
  }
}

inline void check_broadcast(Communicator& comm) { check_broadcast_of(comm, false); }
inline void check_native_broadcast(Communicator& comm) { check_broadcast_of(comm, true); }

inline void check_allgather(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (const std::size_t block : {0u, 1u, 13u, 5000u}) {
    const std::vector<std::byte> mine = pattern(r, 88, block);
    std::vector<std::byte> all = garbage(block * static_cast<std::size_t>(n));
    comm.allgather(mine, all);
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(same_bytes(std::span(all).subspan(static_cast<std::size_t>(q) * block, block),
                             pattern(q, 88, block)))
          << "rank " << r << ", block " << block << " bytes, from rank " << q;
    }
  }
}

// allgatherv with count patterns that include zeros, all zeros, one large
// block and one non-empty rank.
// `native`: the backend's native_allgatherv instead of allgatherv.
inline void check_allgatherv_of(Communicator& comm, bool native) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::vector<std::function<std::size_t(int)>> count_patterns = {
      [](int q) { return q % 3 == 1 ? std::size_t{0} : static_cast<std::size_t>(100 * q + 5); },
      [](int) { return std::size_t{0}; },
      [n](int q) { return q == n - 1 ? std::size_t{1000} : std::size_t{0}; },
      [](int q) { return q == 0 ? std::size_t{70000} : std::size_t{1}; },
  };
  for (std::size_t p = 0; p < count_patterns.size(); ++p) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) counts[q] = count_patterns[p](q);
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    const std::vector<std::byte> mine = pattern(r, 99, counts[r]);
    std::vector<std::byte> all = garbage(total);
    if (native) {
      comm.native_allgatherv(mine, all, counts);
    } else {
      comm.allgatherv(mine, all, counts);
    }
    std::size_t offset = 0;
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(same_bytes(std::span(all).subspan(offset, counts[q]), pattern(q, 99, counts[q])))
          << "rank " << r << ", count pattern " << p << ", block of rank " << q;
      offset += counts[q];
    }
  }
}

inline void check_allgatherv(Communicator& comm) { check_allgatherv_of(comm, false); }
inline void check_native_allgatherv(Communicator& comm) { check_allgatherv_of(comm, true); }

// alltoallv with varied counts, zeros included (also to and from itself).
inline void check_alltoallv(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  // Bytes that rank `src` sends to rank `dst` under each pattern.
  const std::vector<std::function<std::size_t(int, int)>> count_patterns = {
      [](int src, int dst) { return static_cast<std::size_t>((src + 2 * dst) % 4 * 37); },
      [](int, int) { return std::size_t{0}; },
      [](int src, int dst) {
        return (src + dst) % 2 == 0 ? static_cast<std::size_t>(20000 + src * 3 + dst)
                                    : std::size_t{0};
      },
      [](int src, int dst) { return static_cast<std::size_t>(1 + src + 5 * dst); },
  };
  for (std::size_t p = 0; p < count_patterns.size(); ++p) {
    std::vector<std::size_t> send_counts(static_cast<std::size_t>(n));
    std::vector<std::size_t> recv_counts(static_cast<std::size_t>(n));
    std::vector<std::byte> send;
    for (int q = 0; q < n; ++q) {
      send_counts[q] = count_patterns[p](r, q);
      recv_counts[q] = count_patterns[p](q, r);
      const std::vector<std::byte> block = pattern(r, q, send_counts[q]);
      send.insert(send.end(), block.begin(), block.end());
    }
    std::vector<std::byte> recv =
        garbage(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    comm.alltoallv(send, send_counts, recv, recv_counts);
    std::size_t offset = 0;
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(same_bytes(std::span(recv).subspan(offset, recv_counts[q]),
                             pattern(q, r, recv_counts[q])))
          << "rank " << r << ", count pattern " << p << ", block from rank " << q;
      offset += recv_counts[q];
    }
  }
}

// Arguments that can never work are InvalidArgument on the calling rank,
// before any communication (so every rank throws and the world stays usable).
inline void check_invalid_arguments(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  std::byte byte{};
  const std::span<std::byte> one(&byte, 1);
  expect_invalid_argument([&] { comm.isend(one, n, 0); }, fmt::format("peer rank {}", n),
                          "isend to rank size()");
  expect_invalid_argument([&] { comm.irecv(one, -1, 0); }, "peer rank -1", "irecv from rank -1");
  expect_invalid_argument([&] { comm.isend(one, r, kMaxTag + 1); },
                          fmt::format("tag {}", kMaxTag + 1), "isend with tag kMaxTag + 1");
  expect_invalid_argument([&] { comm.irecv(one, r, -1); }, "tag -1", "irecv with tag -1");
  expect_invalid_argument([&] { comm.broadcast(one, n); }, fmt::format("peer rank {}", n),
                          "broadcast from root size()");

  const std::vector<std::size_t> too_many(static_cast<std::size_t>(n) + 1, 1);
  std::vector<std::byte> all(static_cast<std::size_t>(n) + 1);
  expect_invalid_argument([&] { comm.allgatherv(one, all, too_many); }, "counts",
                          "allgatherv with size() + 1 counts");
  const std::vector<std::size_t> ones(static_cast<std::size_t>(n), 1);
  std::vector<std::byte> two(2);
  expect_invalid_argument([&] { comm.allgatherv(two, all, ones); }, "allgatherv",
                          "allgatherv sending more than its count");
  expect_invalid_argument([&] { comm.allgather(one, all); }, "allgather",
                          "allgather into a buffer of the wrong size");
  const std::vector<std::size_t> short_counts(static_cast<std::size_t>(n) - 1, 0);
  expect_invalid_argument([&] { comm.alltoallv({}, short_counts, {}, ones); }, "counts",
                          "alltoallv with size() - 1 send counts");
  expect_invalid_argument([&] { comm.set_timeout(std::chrono::milliseconds(0)); }, "timeout",
                          "a zero timeout");
  comm.barrier();  // still usable
}

// The native all-reduce sums exactly (small integers in float) where the
// backend has one, and is NotSupported where it does not.
inline void check_native_allreduce(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  std::vector<float> floats(1000);
  std::vector<std::int64_t> ints(100);
  for (std::size_t i = 0; i < floats.size(); ++i) {
    floats[i] = static_cast<float>((r + 1) * static_cast<int>(i % 97));
  }
  for (std::size_t i = 0; i < ints.size(); ++i) {
    ints[i] = (std::int64_t{1} << 40) * r + static_cast<std::int64_t>(i);
  }
  if (!comm.has_native_allreduce()) {
    EXPECT_THROW(comm.native_allreduce(std::span<float>(floats)), NotSupported);
    EXPECT_THROW(comm.native_allreduce(std::span<std::int64_t>(ints)), NotSupported);
    return;
  }
  comm.native_allreduce(std::span<float>(floats));
  comm.native_allreduce(std::span<std::int64_t>(ints));
  comm.native_allreduce(std::span<float>());
  const int rank_sum = n * (n + 1) / 2;  // sum of r + 1
  for (std::size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(floats[i], static_cast<float>(rank_sum * static_cast<int>(i % 97)))
        << "rank " << r << ", element " << i;
  }
  const std::int64_t sum_of_ranks = std::int64_t{n} * (n - 1) / 2;
  for (std::size_t i = 0; i < ints.size(); ++i) {
    ASSERT_EQ(ints[i], (std::int64_t{1} << 40) * sum_of_ranks + n * static_cast<std::int64_t>(i))
        << "rank " << r << ", element " << i;
  }
}

// allgather_value and broadcast_value from typed.h.
inline void check_typed_helpers(Communicator& comm) {
  struct Record {
    std::int32_t rank;
    double value;
  };
  const int n = comm.size();
  const int r = comm.rank();
  const std::vector<Record> all = allgather_value(comm, Record{r, 0.5 * r});
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(all[q].rank, q);
    EXPECT_EQ(all[q].value, 0.5 * q);
  }
  for (int root = 0; root < n; ++root) {
    const std::int64_t mine = r == root ? std::int64_t{1000} + root : std::int64_t{-1};
    EXPECT_EQ(broadcast_value(comm, mine, root), 1000 + root) << "rank " << r << ", root " << root;
  }
}

}  // namespace sparsecomm::checks
