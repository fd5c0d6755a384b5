/* cpuformer C API: run transformer models from C, C++, Rust, Go or Swift, without Python.
 *
 * It opens model directories written by `cpuformer convert` (any dtype: float32, float16,
 * bfloat16, int8, int4), whose cpuformer_graph.json tells the C++ core how to build the model, and
 * plain Hugging Face directories of the families the C++ architecture registry declares, and runs
 * them on token ids: encoders give hidden states and pooled embeddings, decoders and
 * encoder-decoders generate tokens with a per-token callback. Tokenization stays outside (ids in,
 * ids out): use the tokenizer.json next to the model with any tokenizers binding. Guide and
 * examples: docs/c-api.md, examples/c/.
 *
 * Conventions
 * - Every function that can fail returns a cf_status and, when `error` is not NULL, writes a
 *   message into it. No exception crosses this boundary; there is no global state besides the
 *   process's thread budget (cf_set_num_threads).
 * - One call at a time per model: a call made while another thread is inside a call on the same
 *   model returns CF_ERROR_BUSY at once (it does not wait). Different models run concurrently.
 * - cf_model_close releases a model's weights; any later call on it returns CF_ERROR_CLOSED until
 *   cf_model_free releases the handle itself (calling into a freed handle is undefined, as for
 *   free()).
 */
#ifndef CPUFORMER_H_
#define CPUFORMER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CF_API __declspec(dllexport)
#else
#define CF_API __attribute__((visibility("default")))
#endif

/* The version of this header and library (cpuformer's package version). */
#define CF_API_VERSION 1
CF_API const char* cf_version(void);

typedef enum cf_status {
  CF_OK = 0,
  CF_ERROR_INVALID_ARGUMENT = 1, /* a NULL pointer, an invalid option value, a token id out of range, ... */
  CF_ERROR_IO = 2,               /* the path does not exist, is not a directory, or cannot be read */
  CF_ERROR_INVALID_MODEL = 3,    /* not a model directory this build opens, or its files are damaged or unsupported */
  CF_ERROR_WRONG_KIND = 4,       /* e.g. cf_encode on a decoder */
  CF_ERROR_BUFFER_TOO_SMALL = 5, /* the output buffer cannot hold the result (the size needed is reported) */
  CF_ERROR_OUT_OF_MEMORY = 6,
  CF_ERROR_BUSY = 7,   /* another thread is inside a call on this model */
  CF_ERROR_CLOSED = 8, /* the model was closed */
  CF_ERROR_INTERNAL = 9
} cf_status;

/* A status's name ("CF_ERROR_BUSY"). */
CF_API const char* cf_status_name(cf_status status);

typedef struct cf_error {
  cf_status status;
  char message[1024]; /* NUL-terminated; empty when status is CF_OK */
} cf_error;

typedef enum cf_model_kind { CF_ENCODER = 0, CF_DECODER = 1, CF_SEQ2SEQ = 2 } cf_model_kind;

typedef struct cf_model cf_model;

typedef struct cf_open_options {
  /* "float32", "float16", "bfloat16", "int8" or "int4". A plain Hugging Face directory is packed
   * into it at open (NULL: float32); a converted directory runs in the dtype it stores, which this
   * must then name (or be NULL: another dtype is CF_ERROR_INVALID_ARGUMENT, before any weight is
   * read). */
  const char* dtype;
  /* Threads of this model's calls: 0 for the process default, else 1..1024. */
  int num_threads;
} cf_open_options;

/* Defaults: dtype NULL, num_threads 0. */
CF_API void cf_open_options_init(cf_open_options* options);

/* Opens the model directory `path` (options may be NULL): one written by `cpuformer convert`, or a
 * plain Hugging Face directory (config.json + model.safetensors or its shards) of a family the C++
 * architecture registry declares: every text family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ELECTRA,
 * ALBERT, DeBERTa, ModernBERT, XLNet, GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3, Marian,
 * BART, mBART, M2M100 / NLLB, T5, mT5; a task-head checkpoint opens as its encoder; docs/c-api.md). */
CF_API cf_status cf_model_open(const char* path, const cf_open_options* options, cf_model** model, cf_error* error);
/* Releases the weights; later calls return CF_ERROR_CLOSED. Closing twice is fine. */
CF_API cf_status cf_model_close(cf_model* model, cf_error* error);
/* Closes (if needed) and frees the handle. NULL is ignored. */
CF_API void cf_model_free(cf_model* model);

typedef struct cf_model_info {
  cf_model_kind kind;
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t num_layers;     /* the encoder's, or the decoder's of a decoder-only model */
  int64_t max_positions;  /* the longest sequence (0: no limit) */
  char dtype[16];         /* "float32", "int8", ... */
  char architecture[128]; /* config.json's class name, e.g. "GPT2LMHeadModel" */
} cf_model_info;

CF_API cf_status cf_model_get_info(const cf_model* model, cf_model_info* info, cf_error* error);

/* Encoders: the last hidden state [batch, seq_len, hidden_size] of input_ids [batch, seq_len]
 * (row-major); attention_mask (0/1, NULL = all ones) and token_type_ids (NULL = zeros) have the
 * same shape. `out` holds out_len floats. */
CF_API cf_status cf_encode(cf_model* model, const int64_t* input_ids, const int64_t* attention_mask,
                           const int64_t* token_type_ids, size_t batch, size_t seq_len, float* out, size_t out_len,
                           cf_error* error);

typedef enum cf_pooling { CF_POOL_MEAN = 0, CF_POOL_CLS = 1, CF_POOL_MAX = 2, CF_POOL_LAST = 3 } cf_pooling;

/* Encoders: one embedding per sequence [batch, hidden_size]: the hidden states pooled (`pooling`, a
 * cf_pooling value) over the
 * unpadded tokens (mean, first token, elementwise max, last token), then L2-normalised when
 * `normalize` is non-zero — as Encoder.embed(ids, pooling=..., normalize=...) in Python. */
CF_API cf_status cf_embed(cf_model* model, const int64_t* input_ids, const int64_t* attention_mask, size_t batch,
                          size_t seq_len, int pooling, int normalize, float* out, size_t out_len, cf_error* error);

/* Called with each new token of a generation (index: the sequence, 0 for greedy and sampling;
 * beam search reports the finished best sequence). Return 0 to go on, non-zero to stop: the
 * generation then ends with CF_FINISH_STOPPED and the tokens so far. */
typedef int (*cf_token_callback)(void* user_data, size_t index, int64_t token);

typedef enum cf_finish_reason { CF_FINISH_EOS = 0, CF_FINISH_LENGTH = 1, CF_FINISH_STOPPED = 2 } cf_finish_reason;

typedef struct cf_generate_options {
  int64_t max_new_tokens;   /* >= 0 (0: no new token); default 20 */
  int64_t min_new_tokens;   /* default 0 */
  int do_sample;            /* 0: greedy or beam search (default); 1: sampling */
  double temperature;       /* > 0 when sampling; default 1 */
  int64_t top_k;            /* 0: off (default) */
  double top_p;             /* (0, 1]; default 1 */
  double repetition_penalty; /* > 0; default 1 */
  int64_t no_repeat_ngram_size; /* 0: off (default) */
  int64_t num_beams;        /* >= 1; default 1 (beam search when > 1, not with sampling) */
  double length_penalty;    /* beam search; default 1 */
  uint64_t seed;            /* sampling; default 0 */
  const int64_t* eos_token_ids; /* NULL: the model's (generation_config.json); else eos_count ids */
  size_t eos_count;
} cf_generate_options;

/* The defaults above (and the model's EOS tokens). */
CF_API void cf_generate_options_init(cf_generate_options* options);

/* Decoders: continues the prompt; encoder-decoders: the target for the source `prompt` (the
 * decoder start token excluded). The new tokens (EOS included when produced) go to out_tokens
 * (capacity entries), their count to *out_count and the reason to *finish (both may be NULL).
 * Greedy and beam search return exactly the tokens of Python's generate() on the same model.
 * options NULL: the defaults. callback may be NULL. */
CF_API cf_status cf_generate(cf_model* model, const int64_t* prompt, size_t prompt_len,
                             const cf_generate_options* options, cf_token_callback callback, void* user_data,
                             int64_t* out_tokens, size_t capacity, size_t* out_count, cf_finish_reason* finish,
                             cf_error* error);

/* The process-wide thread count of calls whose model has num_threads 0 (1..1024). */
CF_API cf_status cf_set_num_threads(int num_threads, cf_error* error);

/* The process-wide float32 matmul precision, "highest" (the default: float32 FMA) or "high"
 * (float32 GEMMs of 32 rows or more on AMX-BF16 tiles with each operand split into two bfloat16,
 * where the CPU has them; docs/precision.md). Python's cpuformer.set_float32_matmul_precision. */
CF_API cf_status cf_set_float32_matmul_precision(const char* precision, cf_error* error);

#ifdef __cplusplus
}
#endif

#endif /* CPUFORMER_H_ */
