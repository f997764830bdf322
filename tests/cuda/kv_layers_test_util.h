// Host K/V layers (KvLayersView over random bytes) and the kernel-vs-reference cases of the
// kernels that take them, relocation and the per-token hash: one definition for the GPU tests
// (tests/cuda/relocate_test.cc, kv_hash_test.cc) and the CPU emulation (tests/cuda_emu), so a
// case added here runs in both. Header-only and free of CUDA headers.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/views.h"

namespace vtoken::cuda::testing {

// Host K/V layers of random bytes. Layer pointer i (K of layer l is 2l, V 2l + 1) points into
// buffer i % num_buffers (0: one buffer per pointer), `misalign` bytes past a 16-byte boundary,
// so fewer buffers than 2 x layers make layers and K / V alias. Each buffer has 32 bytes of slack
// around its rows (REQUIRES: misalign < 16), which a check of every byte covers too.
struct HostKv {
  HostKv(int32_t num_layers, int64_t num_slots, int64_t bytes_per_row, uint64_t seed,
         size_t misalign = 0, int32_t num_buffers = 0)
      : storage(num_buffers > 0 ? num_buffers : 2 * num_layers,
                std::vector<uint8_t>(num_slots * bytes_per_row + 32)) {
    std::mt19937_64 rng(seed);
    for (std::vector<uint8_t>& buffer : storage) {
      for (uint8_t& byte : buffer) byte = static_cast<uint8_t>(rng());
    }
    for (int32_t i = 0; i < 2 * num_layers; ++i) {
      uint8_t* base = storage[i % storage.size()].data();
      base += (16 - reinterpret_cast<uintptr_t>(base) % 16) % 16 + misalign;
      (i % 2 == 0 ? k : v).push_back(base);
    }
    view = {k.data(), v.data(), num_layers, num_slots, bytes_per_row};
  }
  HostKv(const HostKv&) = delete;  // The view points into this object.
  HostKv& operator=(const HostKv&) = delete;

  const uint8_t* Row(bool is_v, int32_t layer, int64_t slot) const {
    return static_cast<const uint8_t*>((is_v ? v : k)[layer]) + slot * view.bytes_per_row;
  }

  std::vector<std::vector<uint8_t>> storage;
  std::vector<void*> k, v;
  KvLayersView view;
};

// Moves every second slot of the first half of the blocks into the first fresh blocks of the
// second half, as a reclamation of half-live blocks would.
inline std::vector<SlotPair> PlannerShapedCopies(int64_t num_blocks, int64_t block_size) {
  std::vector<SlotPair> copies;
  int64_t dst = (num_blocks / 2) * block_size;
  for (int64_t slot = 0; slot < (num_blocks / 2) * block_size; slot += 2) {
    copies.push_back({slot, dst++});
  }
  return copies;
}

// A relocation over a HostKv of `num_layers` layers, `num_slots` rows of `bytes_per_row` bytes.
struct RelocateCase {
  std::string label;
  int32_t num_layers = 1;
  int64_t num_slots = 0, bytes_per_row = 0;
  std::vector<SlotPair> copies;
  // The HostKv's seed: its own bytes for each shape.
  uint64_t seed() const { return static_cast<uint64_t>(bytes_per_row * 1000 + num_slots); }
};

// Planner-shaped copies over 10 blocks of 1, 3, 7 and 17 slots, in rows that take every path of
// the launcher: 30-, 1- and 3-byte rows the scalar kernel's byte copies, 20 its 4-byte words; the
// vector kernel copies 16, 48 and 272-byte rows 8 to a warp pass, 1040 and 2048 2 to a pass, 4144
// and 8208 in 2 and 3 segments of at most 4 KiB (4144's last one short).
inline std::vector<RelocateCase> RowWidthAndBlockSizeCases() {
  std::vector<RelocateCase> cases;
  for (int64_t row : {30, 20, 1, 3, 16, 48, 272, 1040, 2048, 4144, 8208}) {
    for (int64_t block_size : {1, 3, 7, 17}) {
      cases.push_back(
          {.label = "row " + std::to_string(row) + " block " + std::to_string(block_size),
           .num_layers = 3,
           .num_slots = 10 * block_size,
           .bytes_per_row = row,
           .copies = PlannerShapedCopies(10, block_size)});
    }
  }
  return cases;
}

// Hashes of `slots` (tokens, in that order) over a HostKv of `num_slots` rows.
struct KvHashCase {
  std::string label;
  int32_t num_layers = 1;
  int64_t num_slots = 0, bytes_per_row = 0;
  uint64_t seed = 0;
  std::vector<int64_t> slots;
};

// 1 and 3 layers, rows shorter than a stripe, straddling stripes and on the aligned path; 300
// tokens (more than one block of threads) in a scattered order.
inline std::vector<KvHashCase> KvHashKernelCases() {
  const int64_t num_slots = 300;
  std::vector<int64_t> slots(num_slots);
  for (int64_t i = 0; i < num_slots; ++i) slots[i] = (i * 7) % num_slots;
  std::vector<KvHashCase> cases;
  for (int32_t layers : {1, 3}) {
    for (int64_t row : {1, 7, 17, 30, 32, 256, 2048}) {
      cases.push_back({.label = "layers " + std::to_string(layers) + " row " + std::to_string(row),
                       .num_layers = layers,
                       .num_slots = num_slots,
                       .bytes_per_row = row,
                       .seed = static_cast<uint64_t>(5 + row),
                       .slots = slots});
    }
  }
  return cases;
}

}  // namespace vtoken::cuda::testing
