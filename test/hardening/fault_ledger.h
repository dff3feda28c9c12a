// The fault tests' delivery ledger: what a sender sent and what its reports said against what
// the receiver's incarnations got, and the checks of fault_injection_test.cpp's header comment.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "uvbus/node.h"

namespace uvbus::hardening {

inline constexpr bus_id kReceiver = 0x1002;

// Record written by the receiver for each message: seq and whether the payload was intact.
struct record {
  uint64_t seq;
  uint64_t ok;
};

constexpr size_t kPayload = 64;
inline void fill(uint64_t seq, uint8_t* p) {
  std::memcpy(p, &seq, 8);
  for (size_t i = 8; i < kPayload; ++i) p[i] = static_cast<uint8_t>(seq * 31 + i);
}

// The delivery accounting of one sender's end-to-end stream of messages, shared by the tests.
struct ledger {
  std::map<uint64_t, errc> report_of;   // seq -> final report
  std::map<uint64_t, uint64_t> seq_of;  // message id -> seq
  std::vector<record> got;
  std::vector<uint64_t> got_epoch;  // the kill epoch each record was received in
  uint64_t next_seq = 0;
  uint64_t accepted = 0;
  uint64_t duplicate_reports = 0;
  // Diagnosis: the kill epoch (number of kills so far) when each message was sent and received.
  uint64_t epoch = 0;
  std::map<uint64_t, uint64_t> sent_epoch;
  std::map<uint64_t, uint64_t> received_epoch;

  void on_report(const delivery_report& r) {
    auto it = seq_of.find(r.message_id);
    if (it == seq_of.end()) return;
    if (report_of.count(it->second) != 0) ++duplicate_reports;
    report_of[it->second] = r.status;
  }
  void send_some(node* sender, int n) {
    send_options o;
    o.require_response = true;
    for (int i = 0; i < n; ++i) {
      uint8_t p[kPayload];
      fill(next_seq, p);
      uint64_t id = 0;
      if (sender->send_data(kReceiver, 1, p, sizeof p, o, &id) != errc::ok) break;
      sent_epoch[next_seq] = epoch;
      seq_of[id] = next_seq++;
      ++accepted;
    }
  }
  // The checks of the header comment; prints the figures.
  // Returns how many messages were delivered again after a kill.
  uint64_t check(const char* what, int kills, uint64_t final_from) const {
    std::set<uint64_t> received;
    std::set<std::pair<uint64_t, uint64_t>> per_epoch;  // (epoch, seq)
    uint64_t last = 0;
    uint64_t last_epoch = 0;
    uint64_t across = 0;  // delivered again after a kill
    bool first = true;
    for (size_t i = 0; i < got.size(); ++i) {
      const record& r = got[i];
      const uint64_t ep = i < got_epoch.size() ? got_epoch[i] : 0;
      EXPECT_EQ(r.ok, 1u) << "corrupted message " << r.seq;
      EXPECT_TRUE(per_epoch.insert({ep, r.seq}).second)
          << "message " << r.seq << " delivered twice to one incarnation";
      if (!received.insert(r.seq).second) ++across;
      if (!first && ep == last_epoch) {
        EXPECT_GT(r.seq, last) << "out of order";
      }
      last = r.seq;
      last_epoch = ep;
      first = false;
      EXPECT_LT(r.seq, next_seq);
    }
    std::printf("[ faults   ]   delivered again after a kill (at least once): %llu\n",
                static_cast<unsigned long long>(across));
    uint64_t ok = 0, failed = 0, failed_but_received = 0, received_after_a_kill = 0;
    std::map<errc, std::pair<uint64_t, uint64_t>> why;  // status -> (failed, of which received)
    for (const auto& [seq, st] : report_of) {
      if (st == errc::ok) {
        ++ok;
        EXPECT_EQ(received.count(seq), 1u) << "message " << seq << " reported ok, never received";
      } else {
        ++failed;
        failed_but_received += received.count(seq);
        ++why[st].first;
        why[st].second += received.count(seq);
        if (received.count(seq) != 0 && received_epoch.count(seq) != 0 &&
            received_epoch.at(seq) != sent_epoch.at(seq)) {
          ++received_after_a_kill;
        }
      }
    }
    if (failed_but_received != 0) {
      std::printf(
          "[ faults   ]   received but reported failed: %llu, of which %llu were sent "
          "before a kill and received after it\n",
          static_cast<unsigned long long>(failed_but_received),
          static_cast<unsigned long long>(received_after_a_kill));
    }
    for (const auto& [st, n] : why) {
      std::printf("[ faults   ]   failed with %s: %llu (%llu received)\n", to_string(st),
                  static_cast<unsigned long long>(n.first),
                  static_cast<unsigned long long>(n.second));
    }
    for (uint64_t s = final_from; s < next_seq; ++s) {
      auto it = report_of.find(s);
      EXPECT_TRUE(it != report_of.end() && it->second == errc::ok) << s;
    }
    EXPECT_EQ(ok + failed, accepted);
    EXPECT_EQ(duplicate_reports, 0u);
    std::printf(
        "[ faults   ] %s, %d kills: %llu accepted, %llu received, %llu ok, %llu failed "
        "(%llu of them received before their ack was lost)\n",
        what, kills, static_cast<unsigned long long>(accepted),
        static_cast<unsigned long long>(received.size()), static_cast<unsigned long long>(ok),
        static_cast<unsigned long long>(failed),
        static_cast<unsigned long long>(failed_but_received));
    return across;
  }
};

}  // namespace uvbus::hardening
