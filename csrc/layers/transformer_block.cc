#include "layers/transformer_block.h"

#include <cstring>
#include <stdexcept>

#include "kernels/activation/activation.h"
#include "kernels/norm/norm.h"
#include "layers/rope.h"
#include "runtime/threading.h"

namespace cpuformer {

TransformerBlock::TransformerBlock(const TransformerConfig& c, const BlockTensors& t, bool cross) {
  const long H = c.hidden_size, I = c.intermediate_size, qw = c.q_width(), kvw = c.kv_width();
  const WeightFormat wt = c.matmul_format();
  auto slot = [&t](const char* name) { return PackedSlot{t.packed, t.packed_prefix + name}; };
  qkv_ = Linear({{t.q.weight, t.q.bias, qw}, {t.k.weight, t.k.bias, kvw}, {t.v.weight, t.v.bias, kvw}}, H, wt,
                slot("qkv"));
  out_ = Linear({{t.o.weight, t.o.bias, H}}, qw, wt, slot("o"));
  attn_norm_ = NormWeights(c, t.attn_norm.weight, t.attn_norm.bias, H);
  if (c.qk_norm) {
    q_norm_.assign(t.q_norm, t.q_norm + c.head_dim);
    k_norm_.assign(t.k_norm, t.k_norm + c.head_dim);
  }
  if (cross) {
    cross_q_ = Linear({{t.cross_q.weight, t.cross_q.bias, qw}}, H, wt, slot("cross_q"));
    cross_kv_ = Linear({{t.cross_k.weight, t.cross_k.bias, kvw}, {t.cross_v.weight, t.cross_v.bias, kvw}}, H, wt,
                       slot("cross_kv"));
    cross_out_ = Linear({{t.cross_o.weight, t.cross_o.bias, H}}, qw, wt, slot("cross_o"));
    cross_norm_ = NormWeights(c, t.cross_norm.weight, t.cross_norm.bias, H);
  }
  if (c.gated_ffn) {
    up_ = Linear({{t.gate.weight, nullptr, I}, {t.up.weight, nullptr, I}}, H, wt, slot("up"));
  } else {
    up_ = Linear({{t.up.weight, t.up.bias, I}}, H, wt, slot("up"));
  }
  down_ = Linear({{t.down.weight, t.down.bias, H}}, I, wt, slot("down"));
  ffn_norm_ = NormWeights(c, t.ffn_norm.weight, t.ffn_norm.bias, H);
}

const float* TransformerBlock::input(const TransformerConfig& c, const NormWeights& norm, const float* h,
                                     BlockWorkspace& ws, long rows) const {
  if (!c.pre_norm || norm.empty()) return h;  // (a pre-norm layer without this norm)
  float* x = ws.x.reserve({rows, c.hidden_size});
  norm.apply(c, h, x, rows);
  return x;
}

void TransformerBlock::residual(const TransformerConfig& c, const Linear& out, const NormWeights& norm,
                                const float* inner, float* h, long rows, BlockWorkspace& ws) const {
  const long H = c.hidden_size;
  if (c.pre_norm) {
    out.apply(inner, rows, out.in_features(), h, H, Activation::kNone, h, H);
  } else {
    float* sum = ws.sum.reserve({rows, H});
    out.apply(inner, rows, out.in_features(), sum, H, Activation::kNone, h, H);
    norm.apply(c, sum, h, rows);
  }
}

bool UnpaddedLayout::build(const int64_t* mask, long batch, long seq_len, bool first_rows) {
  entries.clear();
  token_row.clear();
  for (long b = 0; b < batch; ++b) {
    const int64_t* m = mask + b * seq_len;
    long first = 0;
    while (first < seq_len && !m[first]) ++first;
    long end = first;
    while (end < seq_len && m[end]) ++end;
    for (long t = end; t < seq_len; ++t)
      if (m[t]) return false;
    if (first_rows && first != 0) return false;
    if (end == first) continue;  // all padding: zero rows
    RaggedEntry e;
    e.count = end - first;
    e.offset = tokens();
    for (long t = first; t < end; ++t) token_row.push_back(b * seq_len + t);
    entries.push_back(e);
  }
  return true;
}

void gather_rows(const std::vector<long>& rows, const float* padded, long width, float* packed) {
  parallel_ranges(static_cast<long>(rows.size()), 16, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) std::memcpy(packed + n * width, padded + rows[n] * width, width * sizeof(float));
  });
}

void scatter_rows(const std::vector<long>& rows, const float* packed, long width, long padded_rows, float* padded) {
  std::memset(padded, 0, padded_rows * width * sizeof(float));
  for (std::size_t n = 0; n < rows.size(); ++n)
    std::memcpy(padded + rows[n] * width, packed + n * width, width * sizeof(float));
}

void TransformerBlock::self_attention(const TransformerConfig& c, float* h, SelfAttentionInput& in,
                                      BlockWorkspace& ws) const {
  AttentionArgs& a = in.args;
  const long D = c.head_dim, heads = c.num_heads, kv_heads = c.num_kv_heads;
  const long qw = c.q_width(), kvw = c.kv_width(), row = c.qkv_width();
  const long t_new = a.q_len, N = a.batch * a.q_len;  // (the model checked the product)
  const float* x = input(c, attn_norm_, h, ws, N);
  float* qkv = ws.qkv.reserve({N, row});  // per token: q heads | k heads | v heads
  qkv_.apply(x, N, c.hidden_size, qkv, row);

  KvCache* cache = in.cache;
  if (cache || c.qk_norm || in.rope) {
    // Per token: q/k head norms, RoPE, then k and v into the cache slots.
    const NormKernels& nk = norm_kernels();
    parallel_ranges(N, 4, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        float* q = qkv + n * row;
        float* k = q + qw;
        const float* v = k + kvw;
        if (c.qk_norm) {
          for (long i = 0; i < heads; ++i)
            nk.rms_norm_row(q + i * D, nullptr, nullptr, q_norm_.data(), c.norm_eps, q + i * D, D);
          for (long i = 0; i < kv_heads; ++i)
            nk.rms_norm_row(k + i * D, nullptr, nullptr, k_norm_.data(), c.norm_eps, k + i * D, D);
        }
        if (in.rope) {
          rope_apply(in.rope + n * D, D / 2, heads, q);
          rope_apply(in.rope + n * D, D / 2, kv_heads, k);
        }
        if (cache && in.entries) {
          const RaggedEntry& e = in.entries[in.token_entry[n]];
          for (long i = 0; i < kv_heads; ++i)
            cache->store(in.layer, e.row, i, e.start + n - e.offset, k + i * D, v + i * D);
        } else if (cache) {
          const long r = n / t_new, slot = in.start + n % t_new;
          for (long i = 0; i < kv_heads; ++i) cache->store(in.layer, r, i, slot, k + i * D, v + i * D);
        }
      }
    });
  }

  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = D;
  a.q = qkv;
  a.q_stride_b = t_new * row;
  a.q_stride_h = D;
  a.q_stride_t = row;
  if (cache) {
    cache->view(in.layer, a);
  } else {
    a.k = qkv + qw;
    a.v = qkv + qw + kvw;
    a.k_stride_b = a.v_stride_b = t_new * row;
    a.k_stride_h = a.v_stride_h = D;
    a.k_stride_t = a.v_stride_t = row;
  }
  float* context = ws.context.reserve({N, qw});  // [tokens, heads, D]
  a.out = context;
  a.out_stride_b = t_new * qw;
  a.out_stride_h = D;
  a.out_stride_t = qw;
  if ((in.entries || in.picked) && in.hook) throw std::logic_error("a ragged or picked-token pass runs no hook");
  if (in.entries && !cache && a.mask) throw std::logic_error("an unpadded batch has no key mask");
  if (in.pick_at && cache) throw std::logic_error("a pass with a KV cache picks first or last tokens");
  // The call for entry `entry`'s queries [first, first + q_len) (positions within the entry) into
  // out. With a cache (decoding): causal over the row's cached slots and the new ones; without (an
  // unpadded encoder batch): the entry's own tokens, read in place (a.causal, a.window kept). The
  // calls of all entries run together (attention_many: one parallel region).
  auto entry_call = [&](const RaggedEntry& entry, long first, long q_len, float* out) {
    AttentionArgs one = a;
    one.batch = 1;
    one.q_len = q_len;
    one.mask = nullptr;
    one.q = qkv + (entry.offset + first) * row;
    one.out = out;
    if (cache) {
      cache->view(in.layer, one, entry.row);
      one.kv_len = entry.start + entry.count;
      one.causal = true;
      one.causal_offset = entry.start + first;
    } else {
      one.k = a.k + entry.offset * row;
      one.v = a.v + entry.offset * row;
      one.kv_len = entry.count;
      one.causal_offset = first;
    }
    return one;
  };
  if (in.picked) {  // one query per sequence: its first, its last, or the token pick_at names
    const long sequences = in.entries ? in.num_entries : a.batch;
    // The picked token's position within sequence (entry) s of `count` tokens.
    auto pick = [&](long s, long count) { return in.pick_at ? in.pick_at[s] : in.pick_last ? count - 1 : 0; };
    // The residual input: each sequence's picked row of h.
    for (long s = 0; s < sequences; ++s) {
      const long r = in.entries ? in.entries[s].offset + pick(s, in.entries[s].count) : s * t_new + pick(s, t_new);
      std::memcpy(in.picked + s * c.hidden_size, h + r * c.hidden_size, c.hidden_size * sizeof(float));
    }
    a.q_len = 1;
    a.out_stride_b = qw;
    if (in.entries) {
      ws.calls.clear();
      for (long s = 0; s < sequences; ++s)
        ws.calls.push_back(entry_call(in.entries[s], pick(s, in.entries[s].count), 1, context + s * qw));
      attention_many(ws.calls.data(), sequences);
    } else if (in.pick_at) {  // a position of its own per sequence: one attention each
      ws.calls.clear();
      for (long s = 0; s < sequences; ++s) {
        AttentionArgs one = a;
        one.batch = 1;
        one.q = qkv + (s * t_new + pick(s, t_new)) * row;
        one.k = a.k + s * a.k_stride_b;
        one.v = a.v + s * a.v_stride_b;
        if (a.mask) one.mask = a.mask + s * a.mask_stride_b + pick(s, t_new) * a.mask_stride_q;
        one.causal_offset = a.causal_offset + pick(s, t_new);
        one.out = context + s * qw;
        ws.calls.push_back(one);
      }
      attention_many(ws.calls.data(), sequences);
    } else {
      a.q = qkv + pick(0, t_new) * row;
      a.causal_offset += pick(0, t_new);  // the query's position among the keys
      if (a.mask) a.mask += pick(0, t_new) * a.mask_stride_q;  // and its row of a per-query mask
      attention(a);
    }
    residual(c, out_, attn_norm_, context, in.picked, sequences, ws);
    return;
  }
  if (in.entries) {
    ws.calls.clear();
    for (long e = 0; e < in.num_entries; ++e) {
      const RaggedEntry& entry = in.entries[e];
      ws.calls.push_back(entry_call(entry, 0, entry.count, context + entry.offset * qw));
    }
    attention_many(ws.calls.data(), in.num_entries);
  } else if (in.hook) {
    in.hook->attend(a);
  } else {
    attention(a);
  }
  residual(c, out_, attn_norm_, context, h, N, ws);
}

void TransformerBlock::cross_attention(const TransformerConfig& c, float* h, long tokens, AttentionArgs a,
                                       BlockWorkspace& ws) const {
  const long D = c.head_dim, qw = c.q_width();
  const float* x = input(c, cross_norm_, h, ws, tokens);
  float* q = ws.q.reserve({tokens, qw});
  cross_q_.apply(x, tokens, c.hidden_size, q, qw);
  a.heads = c.num_heads;
  a.kv_heads = c.num_kv_heads;
  a.head_dim = D;
  a.q = q;
  a.q_stride_b = a.q_len * qw;
  a.q_stride_h = D;
  a.q_stride_t = qw;
  float* context = ws.context.reserve({tokens, qw});
  a.out = context;
  a.out_stride_b = a.q_len * qw;
  a.out_stride_h = D;
  a.out_stride_t = qw;
  attention(a);
  residual(c, cross_out_, cross_norm_, context, h, tokens, ws);
}

void TransformerBlock::ffn(const TransformerConfig& c, float* h, long tokens, BlockWorkspace& ws) const {
  const long H = c.hidden_size, F = c.intermediate_size;
  const float* x = input(c, ffn_norm_, h, ws, tokens);
  if (!c.gated_ffn) {
    float* f = ws.ffn.reserve({tokens, F});
    up_.apply(x, tokens, H, f, F, c.activation);
    residual(c, down_, ffn_norm_, f, h, tokens, ws);
    return;
  }
  float* f = ws.ffn.reserve({tokens, 2, F});  // [tokens, gate | up]
  up_.apply(x, tokens, H, f, 2 * F);
  const ActivationKernels& ak = activation_kernels();
  parallel_ranges(tokens, 4, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      float* gate = f + n * 2 * F;
      const float* up = gate + F;
      if (c.activation == Activation::kSilu) {
        ak.silu_mul(gate, up, gate, F);
      } else {
        ak.apply(c.activation, gate, gate, F);
        for (long j = 0; j < F; ++j) gate[j] *= up[j];
      }
    }
  });
  // The gated products sit in the first F columns of each 2F-wide row: a strided GEMM input.
  float* sum = c.pre_norm ? h : ws.sum.reserve({tokens, H});
  down_.apply(f, tokens, 2 * F, sum, H, Activation::kNone, h, H);
  if (!c.pre_norm) ffn_norm_.apply(c, sum, h, tokens);
}

}  // namespace cpuformer
