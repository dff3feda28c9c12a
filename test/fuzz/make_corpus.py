#!/usr/bin/env python3
"""Writes the seed corpora under test/fuzz/corpus/<target>/: small valid inputs (and a few
typical invalid ones) that give libFuzzer a head start. Deterministic; re-run after changing an
input layout: python3 test/fuzz/make_corpus.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def murmur3_x86_32(data, seed=0):
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = struct.unpack_from("<I", data, i)[0]
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = 0
    tail = data[n:]
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def varint(v):
    out = [v & 0x7F]
    v >>= 7
    while v:
        out.append(0x80 | (v & 0x7F))
        v >>= 7
    return bytes(reversed(out))


def frame(payload):
    return struct.pack("<I", murmur3_x86_32(payload)) + varint(len(payload)) + payload


assert frame(b"hello") == bytes.fromhex("47fa8b240568656c6c6f"), frame(b"hello").hex()
assert varint(300) == b"\x82\x2c" and varint(128) == b"\x81\x00" and varint(0) == b"\x00"


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# fuzz_frame_decoder: [limit index][chunk mode][seed lo][seed hi] stream.
# Limit indices into kLimits {0,1,2,5,16,100,127,128,300,4095,4096,4097,65536}.
L64K, L16, L300, L4096 = 12, 4, 8, 10
seq = b"".join(frame(bytes([i]) * i) for i in range(0, 40, 7))
big = frame(bytes(range(256)) * 20)  # 5120 bytes: a cut frame above the 4 KiB keep bound of old
for name, head, stream in [
    ("hello_one_chunk", (L64K, 0, 0, 0), frame(b"hello")),
    ("hello_bytewise", (L64K, 1, 0, 0), frame(b"hello")),
    ("empty_payload", (L64K, 0, 0, 0), frame(b"")),
    ("seq_chunks3", (L300, 3, 0, 0), seq),
    ("seq_random", (L300, 200, 7, 1), seq),
    ("len128_two_byte_varint", (L300, 0, 0, 0), frame(b"x" * 128)),
    ("len300_at_limit", (L300, 17, 0, 0), frame(b"y" * 300)),
    ("big_random_chunks", (L64K, 255, 3, 9), big + frame(b"tail")),
    ("big_over_4096_limit", (L4096, 100, 0, 0), big),
    ("oversize", (L16, 0, 0, 0), frame(b"z" * 100)),
    ("bad_hash", (L64K, 0, 0, 0), b"\0\0\0\0\x05hello"),
    ("good_then_garbage", (L64K, 2, 0, 0), frame(b"ok") + b"\xde\xad\xbe\xef" * 4),
    ("bad_varint", (L64K, 0, 0, 0), b"\0\0\0\0" + b"\xff" * 11),
    ("len_2_pow_63", (L64K, 0, 0, 0), b"\0\0\0\0" + varint(1 << 63)),
    ("half_frame", (L64K, 5, 0, 0), frame(b"z" * 100)[:50]),
]:
    write("fuzz_frame_decoder", name, bytes(head) + stream)

# fuzz_stream_channel: the same layout, except that byte 0 only picks the channel by parity
# (even: limit 300, odd: 64 KiB).
for name, limit_byte, head, stream in [
    ("hello", 1, (0, 0, 0), frame(b"hello")),
    ("seq_chunks3", 0, (3, 0, 0), seq),
    ("seq_random", 0, (200, 7, 1), seq),
    ("big_random_chunks", 1, (255, 3, 9), big + frame(b"tail")),
    ("oversize_300", 0, (0, 0, 0), frame(b"z" * 301)),
    ("good_then_garbage", 1, (2, 0, 0), frame(b"ok") + b"\xde\xad\xbe\xef" * 4),
    ("bad_varint", 1, (0, 0, 0), b"\0\0\0\0" + b"\xff" * 11),
    ("half_frame", 1, (5, 0, 0), frame(b"z" * 100)[:50]),
]:
    write("fuzz_stream_channel", name, bytes([limit_byte]) + bytes(head) + stream)

# fuzz_murmur3_batch: u32 seed, then per buffer: u16 length (high bit clear: low byte, 0..255;
# set: low 14 bits), an alignment byte, the content.
def batch_buf(n, align=0, long=False):
    l = (0x8000 | n) if long else n
    return struct.pack("<HB", l, align) + bytes((i * 7 + n) & 0xFF for i in range(n))


write("fuzz_murmur3_batch", "one_each_0_to_17",
      struct.pack("<I", 0) + b"".join(batch_buf(n, n % 5) for n in range(18)))
write("fuzz_murmur3_batch", "sixteen_64", struct.pack("<I", 0x9747B28C) + batch_buf(64) * 16)
write("fuzz_murmur3_batch", "long_lanes",
      struct.pack("<I", 1) + batch_buf(3000, 1, True) + batch_buf(1000, 2, True) + batch_buf(9) * 6)

# fuzz_crc32c: u32 CRC to continue from (0: fresh), a cut byte, an alignment byte, the data.
def crc_input(start, cut, align, n):
    return struct.pack("<IBB", start, cut, align) + bytes((i * 13 + n) & 0xFF for i in range(n))


write("fuzz_crc32c", "fresh_71", crc_input(0, 30, 3, 71))
write("fuzz_crc32c", "continued_300", crc_input(0xDEADBEEF, 200, 1, 300))
write("fuzz_crc32c", "lanes_1000", crc_input(0, 255, 7, 1000))
write("fuzz_crc32c", "short_5", crc_input(0x12345678, 2, 0, 5))

# fuzz_varint: bytes to decode; the first 8 are also a value to encode.
for v in (0, 1, 127, 128, 300, 16383, 16384, (1 << 32) - 1, (1 << 63), (1 << 64) - 1):
    write("fuzz_varint", "enc_%x" % v, varint(v))
write("fuzz_varint", "noncanonical_80_00", b"\x80\x00")
write("fuzz_varint", "too_long_11", b"\x81" * 11)
write("fuzz_varint", "overflow_10", b"\xff" * 9 + b"\x7f")

# fuzz_address: one URL per scheme and form.
for i, url in enumerate([
        "ipv4://127.0.0.1:16389", "ipv4://0.0.0.0:0", "ipv6://[::1]:16389", "ipv6://::1:16389",
        "ipv6://[fe80::1:2:3]:1", "dns://localhost:16389", "dns://[localhost]:1",
        "unix:///tmp/x.sock", "unix://rel/x.sock", "shm://name", "shm:///name", "shm://0x1234",
        "shm://4660", "mem://name", "http://x:1", "ipv4://1.2.3.4:65535"]):
    write("fuzz_address", "url_%02d" % i, url.encode())

# fuzz_write_queue: [flags][ring lo][ring hi]([max_bytes lo][hi])([max_blocks]) then ops:
# opcode % 8: 0-2 reserve (size byte: < 0x80 -> size % 72; else a u16 % 6000 follows),
# 3-4 pop, 5 unreserve, 6 merge (cap u16, max_block u16 unless opcode & 0x80), 7 visit (u8).
def ring_cfg(ring, max_bytes=None, max_blocks=None, dynamic=False):
    flags = (1 if dynamic else 0) | (2 if max_bytes is None else 0) | (4 if max_blocks is None else 0)
    out = bytes([flags]) + struct.pack("<H", ring)
    if max_bytes is not None:
        out += struct.pack("<H", max_bytes)
    if max_blocks is not None:
        out += bytes([max_blocks])
    return out


R = lambda n: bytes([0, n])          # small reserve
P = bytes([3])                       # pop
U = bytes([5])                       # unreserve
M = lambda cap, mb: bytes([6]) + struct.pack("<HH", cap, mb)
V = bytes([7, 40])                   # visit up to 40
wrap_ops = (R(48) * 4 + P * 2 + R(48) * 2 + P * 2 + U + R(48) * 3 + M(4000, 3000) + V) * 2
write("fuzz_write_queue", "static_wrap_unreserve", ring_cfg(304) + wrap_ops)
write("fuzz_write_queue", "static_merge", ring_cfg(1024) + (R(10) + R(60)) * 8 + M(200, 3000) + V + P * 4 + M(4000, 50))
write("fuzz_write_queue", "static_limits", ring_cfg(2048, 500, 6) + R(70) * 10 + P + R(70) + U + V)
write("fuzz_write_queue", "dynamic_limits", ring_cfg(0, 300, 5, dynamic=True) + R(70) * 6 + P + U + M(100, 3000) + V)
write("fuzz_write_queue", "dynamic_big", ring_cfg(0, 4000, 40, dynamic=True) + bytes([0, 0x80, 0xa0, 0x0f]) + R(1) + P + P)
write("fuzz_write_queue", "invalid_small_ring", ring_cfg(8) + R(1) + P)

# Bus protocol (docs/protocol.md): header = version, type, flags, ttl, u32 body_len, u64 source,
# u64 target, u64 sequence; little-endian throughout.
def header(mtype, body, flags=0, ttl=16, src=0x1001, dst=0x2002, seq=7):
    return struct.pack("<BBBBIQQQ", 1, mtype, flags, ttl, len(body), src, dst, seq) + body


def str8(s):
    return bytes([len(s)]) + s


def str16(s):
    return struct.pack("<H", len(s)) + s


def node_info(id_, pid=1234, host=b"host-abc", name=b"gw1", subnets=((0x1200, 8),),
              listen=(b"ipv4://127.0.0.1:16389", b"shm://uvbus-1")):
    out = struct.pack("<QI", id_, pid) + str8(host) + str8(name) + bytes([len(subnets)])
    for prefix, bits in subnets:
        out += struct.pack("<QB", prefix, bits)
    out += bytes([len(listen)])
    for url in listen:
        out += str16(url)
    return out


nonce = bytes(range(32))
proof = bytes(range(100, 132))
challenge = struct.pack("<BBQ", 1, 1, 0x1000) + nonce
register = bytes([1, 1, 1]) + node_info(0x1201) + proof
register_sib = bytes([1, 1, 2]) + node_info(0x1202, subnets=(), listen=()) + proof
reply_ok = struct.pack("<HB", 0, 1) + node_info(0x1000, subnets=((0x1000, 12), (0x2000, 4))) + str8(b"")
reply_refused = struct.pack("<HB", 1, 0) + node_info(0, host=b"", name=b"", subnets=(), listen=()) + str8(b"access denied")
bodies = [
    ("challenge", 1, challenge), ("register", 2, register), ("register_sibling", 2, register_sib),
    ("reply_ok", 3, reply_ok), ("reply_refused", 3, reply_refused),
    ("ping", 4, struct.pack("<Q", 123456789)), ("pong", 5, struct.pack("<Q", 123456789)),
    ("data", 6, struct.pack("<I", 9) + b"hello"), ("data_empty", 6, struct.pack("<I", 0)),
    ("forward", 7, struct.pack("<I", 9) + b"relayed"), ("ack", 8, struct.pack("<QH", 7, 0)),
    ("ack_failed", 8, struct.pack("<QH", 7, 7)), ("command_echo", 9, struct.pack("<I", 4) + b"args"),
    ("command_reply", 10, struct.pack("<IH", 1, 0) + b"0x1000/12 direct\n"),
    ("bye", 11, struct.pack("<H", 6)),
]
for name, mtype, body in bodies:
    write("fuzz_bus_message", name, header(mtype, body, flags=1 if mtype == 6 else 0))
write("fuzz_bus_message", "bad_body_len", header(6, b"\0\0\0\0x")[:-1])
for which, name, body in [(0, "node_info", node_info(0x1201)),
                          (0, "node_info_empty", node_info(0, host=b"", name=b"", subnets=(), listen=())),
                          (1, "challenge", challenge), (2, "register", register),
                          (2, "register_sibling", register_sib), (3, "reply_ok", reply_ok),
                          (3, "reply_refused", reply_refused)]:
    write("fuzz_registration", name, bytes([which]) + body)

# fuzz_shm_image: [node size sel][ring nodes sel][records][record sizes/4...] then patches
# ([kind][...], see the target's header comment).
def shm(node_sel, ring_sel, sizes, patches=b""):
    return bytes([node_sel, ring_sel, len(sizes)] + list(sizes)) + patches


write("fuzz_shm_image", "clean_5_records", shm(0, 0, [1, 2, 8, 30, 0]))
write("fuzz_shm_image", "clean_full_ring", shm(1, 1, [60] * 20))
write("fuzz_shm_image", "write_pos_far_ahead", shm(0, 0, [4, 4], bytes([0x82]) + struct.pack("<Q", 1 << 62)))
write("fuzz_shm_image", "write_pos_plus_5", shm(0, 0, [4, 4], bytes([2]) + struct.pack("<h", 5)))
write("fuzz_shm_image", "read_pos_behind", shm(0, 0, [4, 4, 4], bytes([3]) + struct.pack("<h", -3)))
write("fuzz_shm_image", "record_len_huge", shm(0, 0, [4, 4], bytes([1]) + struct.pack("<HB", 8, 4) + b"\xff\xff\xff\x7f"))
write("fuzz_shm_image", "record_ctl_scribbled", shm(2, 2, [10, 10], bytes([1]) + struct.pack("<HB", 0, 8) + b"\x01" * 8))
write("fuzz_shm_image", "header_node_size", shm(0, 0, [1], bytes([0]) + struct.pack("<HB", 32, 4) + struct.pack("<I", 4096)))

# fuzz_compress: [codec and level][limit - 1, u16 LE][block, also compressed as a message]
# (see the target's header comment). Blocks: codec byte (1 lz4, 2 zstd) + varint(raw size) + data.
def zblock(codec, raw_size, data):
    return bytes([codec]) + varint(raw_size) + data


LZ4_SEQ = bytes([0x41]) + b"abcd" + struct.pack("<H", 4) + bytes([0xC0]) + b"efghijklmnop"  # 21 B


def zstd_frame(blocks):  # no content size, 128 KiB window; blocks: (type, size, payload)
    out = b"\x28\xb5\x2f\xfd" + bytes([0x00, 7 << 3])
    for i, (btype, size, payload) in enumerate(blocks):
        hdr = size << 3 | btype << 1 | (1 if i == len(blocks) - 1 else 0)
        out += struct.pack("<I", hdr)[:3] + payload
    return out


JSON = b'{"id":4711,"type":"player","pos":{"x":12.50,"y":300.25,"z":1.00},"health":100},' * 4
for name, sel, limit, block in [
        ("lz4_literals_match", 0, 4096, zblock(1, 21, LZ4_SEQ)),
        ("lz4_over_limit", 0, 15, zblock(1, 21, LZ4_SEQ)),
        ("zstd_raw_block", 1, 4096, zblock(2, 5, zstd_frame([(0, 5, b"hello")]))),
        ("zstd_rle_blocks", 1, 4096, zblock(2, 3000, zstd_frame([(1, 1000, b"z")] * 3))),
        ("zstd_rle_bomb", 1, 4096, zblock(2, 4096, zstd_frame([(1, 131072, b"z")] * 8))),
        ("json_as_message_lz4", 2, 65535, JSON),
        ("json_as_message_zstd", 3, 65535, JSON)]:
    write("fuzz_compress", name, bytes([sel]) + struct.pack("<H", limit - 1) + block)
print("corpora written under", os.path.join(HERE, "corpus"))
