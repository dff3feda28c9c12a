// Compression benchmark: ratio and compress / decompress MB/s of each codec and level on the
// snapshot corpus (corpus.h), per message size and encoding; prints a Markdown table
// (docs/compression.md). Each cell is the median of --runs runs over --mib MiB of messages.
//   build/uvbus_bench_compress [--runs 5] [--mib 4] [--sizes 512,4096,16384]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/compress.h"
#include "corpus.h"

namespace {

using uvbus::codec;
using uvbus::compressor;
using uvbus::bench::corpus_format;
using clock_type = std::chrono::steady_clock;

struct setting {
  codec c;
  int level;
  const char* label;
};

const setting kSettings[] = {
    {codec::lz4, -8, "lz4 acceleration 8"},
    {codec::lz4, 0, "lz4 default"},
    {codec::lz4, 9, "lz4 HC 9"},
    {codec::zstd, 1, "zstd 1"},
    {codec::zstd, 3, "zstd 3"},
    {codec::zstd, 6, "zstd 6"},
    {codec::zstd, 9, "zstd 9"},
};

struct options {
  int runs = 5;
  size_t mib = 4;
  std::vector<size_t> sizes = {512, 4096, 16384};
};

struct result {
  double ratio = 0;       // input bytes / bytes sent (blocks, or the raw message when kept)
  double kept_raw = 0;    // fraction of messages sent raw
  double comp_mbs = 0;    // input MB/s through compress()
  double decomp_mbs = 0;  // output MB/s through decompress(), compressed messages only
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// One run: compress every message, then decompress every block; checks the round trip.
bool run_once(compressor& z, const setting& s, const std::vector<std::vector<uint8_t>>& msgs,
              result* r, double* ct, double* dt) {
  const size_t size = msgs[0].size();
  std::vector<std::vector<uint8_t>> blocks(msgs.size(), std::vector<uint8_t>(size));
  std::vector<size_t> lens(msgs.size());
  size_t sent = 0;
  size_t raw = 0;
  auto t0 = clock_type::now();
  for (size_t i = 0; i < msgs.size(); ++i) {
    lens[i] = z.compress(s.c, s.level, msgs[i].data(), size, blocks[i].data(), size);
  }
  *ct = seconds_since(t0);
  std::vector<uint8_t> out(size);
  size_t decoded = 0;
  t0 = clock_type::now();
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (lens[i] == 0) continue;
    const auto d = z.decompress(s.c, blocks[i].data(), lens[i], out.data(), size);
    if (d.code != uvbus::errc::ok || d.size != size) return false;
    decoded += d.size;
  }
  *dt = seconds_since(t0);
  for (size_t i = 0; i < msgs.size(); ++i) {
    sent += lens[i] == 0 ? size : lens[i];
    raw += lens[i] == 0 ? 1 : 0;
    if (lens[i] != 0) {
      if (z.decompress(s.c, blocks[i].data(), lens[i], out.data(), size).size != size ||
          out != msgs[i]) {
        return false;
      }
    }
  }
  r->ratio = static_cast<double>(size * msgs.size()) / static_cast<double>(sent);
  r->kept_raw = static_cast<double>(raw) / static_cast<double>(msgs.size());
  r->decomp_mbs = *dt > 0 ? static_cast<double>(decoded) / *dt / 1e6 : 0;
  return true;
}

bool measure(const setting& s, const std::vector<std::vector<uint8_t>>& msgs, int runs,
             result* out) {
  compressor z;
  result r;
  std::vector<double> cm;
  std::vector<double> dm;
  const auto bytes = static_cast<double>(msgs.size() * msgs[0].size());
  double ct = 0;
  double dt = 0;
  if (!run_once(z, s, msgs, &r, &ct, &dt)) return false;  // warm-up: contexts created
  for (int i = 0; i < runs; ++i) {
    if (!run_once(z, s, msgs, &r, &ct, &dt)) return false;
    cm.push_back(bytes / ct / 1e6);
    dm.push_back(r.decomp_mbs);
  }
  r.comp_mbs = median(cm);
  r.decomp_mbs = median(dm);
  *out = r;
  return true;
}

bool parse(int argc, char** argv, options* o) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) return false;
    if (std::strcmp(a, "--runs") == 0) {
      o->runs = std::max(1, static_cast<int>(std::strtol(v, nullptr, 10)));
    } else if (std::strcmp(a, "--mib") == 0) {
      o->mib = static_cast<size_t>(std::max(1, static_cast<int>(std::strtol(v, nullptr, 10))));
    } else if (std::strcmp(a, "--sizes") == 0) {
      o->sizes.clear();
      for (const char* p = v; *p != 0;) {
        char* end = nullptr;
        o->sizes.push_back(std::strtoul(p, &end, 10));
        if (end == p || o->sizes.back() == 0) return false;
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      return false;
    }
    ++i;
  }
  return !o->sizes.empty();
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr, "usage: %s [--runs N] [--mib M] [--sizes 512,4096,16384]\n", argv[0]);
    return 2;
  }
  std::printf(
      "| encoding | size | codec, level | ratio | sent raw | compress MB/s | "
      "decompress MB/s |\n|---|---:|---|---:|---:|---:|---:|\n");
  for (corpus_format f : {corpus_format::json, corpus_format::binary}) {
    for (size_t size : o.sizes) {
      const size_t count = std::max<size_t>(16, (o.mib << 20) / size);
      const auto msgs = uvbus::bench::make_corpus(1, count, size, f);
      for (const setting& s : kSettings) {
        result r;
        if (!measure(s, msgs, o.runs, &r)) {
          std::fprintf(stderr, "%s: round trip failed\n", s.label);
          return 1;
        }
        std::printf("| %s | %zu | %s | %.2f | %.0f%% | %.0f | %.0f |\n", to_string(f), size,
                    s.label, r.ratio, r.kept_raw * 100, r.comp_mbs, r.decomp_mbs);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
