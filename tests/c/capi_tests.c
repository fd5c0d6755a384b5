/* Tests of the C API (include/cpuformer.h), run by scripts/test-c-api.sh (and under
 * AddressSanitizer + UndefinedBehaviorSanitizer there):
 *
 *   cpuformer_capi_tests MODELS [--tolerant]
 *
 * MODELS: the directory tests/c/make_cases.py wrote. Every case of MODELS/cases.txt is run and
 * compared with the Python API's output: hidden states and generated tokens bit for bit, pooled
 * embeddings within the case's tolerance; --tolerant (the sanitizer build, compiled at another
 * optimisation level) compares floats within 1e-4 and only checks that generation runs. Then
 * every error path: NULL pointers, paths that are missing or files, damaged directories, invalid
 * option values, wrong model kinds, small buffers, a callback that stops, a closed model, two
 * threads sharing one model. Exits 1 on any failure, 77 when MODELS is missing. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpuformer.h"

static int failures = 0;
static const char* models_dir = NULL;
static int tolerant = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)

/* status == expected and the message contains `needle` (NULL: any). */
static void expect(cf_status status, const cf_error* error, cf_status expected, const char* needle, const char* what) {
  CHECK(status == expected, "%s: got %s (%s), expected %s", what, cf_status_name(status), error->message,
        cf_status_name(expected));
  CHECK(error->status == status, "%s: error->status %d differs from the returned %d", what, error->status, status);
  if (needle)
    CHECK(strstr(error->message, needle) != NULL, "%s: message '%s' lacks '%s'", what, error->message, needle);
  if (expected == CF_OK) CHECK(error->message[0] == '\0', "%s: CF_OK with message '%s'", what, error->message);
}

static void* read_file(const char* name, size_t* size) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/data/%s", models_dir, name);
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = malloc(n > 0 ? (size_t)n : 1);
  if (n > 0 && fread(data, 1, (size_t)n, f) != (size_t)n) exit(1);
  fclose(f);
  *size = (size_t)n;
  return data;
}

/* name: a directory below the models, or DIRECTORY@DTYPE (a plain Hugging Face directory opened in
 * that dtype). */
static cf_model* open_model(const char* name) {
  char path[4096], dtype[32] = "";
  snprintf(path, sizeof(path), "%s/%s", models_dir, name);
  char* at = strrchr(path, '@');
  if (at) {
    snprintf(dtype, sizeof(dtype), "%s", at + 1);
    *at = '\0';
  }
  cf_model* model = NULL;
  cf_error error;
  cf_open_options options;
  cf_open_options_init(&options);
  if (dtype[0]) options.dtype = dtype;
  options.num_threads = 2; /* as make_cases.py's models: outputs depend on how work is split */
  cf_status s = cf_model_open(path, &options, &model, &error);
  expect(s, &error, CF_OK, NULL, path);
  return model;
}

static void compare_floats(const float* got, const float* want, size_t n, double tolerance, const char* what) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    int same = tolerance == 0.0 ? memcmp(&got[i], &want[i], sizeof(float)) == 0
                                : fabs((double)got[i] - want[i]) <= tolerance * fmax(1.0, fabs(want[i]));
    if (!same && bad++ < 3) fprintf(stderr, "  %s[%zu]: %.9g, Python %.9g\n", what, i, got[i], want[i]);
  }
  CHECK(bad == 0, "%s: %zu of %zu values differ (tolerance %g)", what, bad, n, tolerance);
}

static int run_cases(void) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/cases.txt", models_dir);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  char line[8192];
  int count = 0;
  while (fgets(line, sizeof(line), f)) {
    char kind[32], model_name[256], a[256], b[256], c[256], d[256];
    double tolerance = 0;
    size_t B = 0, T = 0;
    long max_new = 0, beams = 0, sample = 0, seed = 0, pooling = 0, normalize = 0;
    cf_error error;
    if (sscanf(line, "%31s %255s", kind, model_name) != 2) continue;
    cf_model* model = open_model(model_name);
    if (!model) continue;
    ++count;
    if (strcmp(kind, "encode") == 0 && sscanf(line, "%*s %*s %zu %zu %255s %255s %255s", &B, &T, a, b, c) == 5) {
      size_t n_ids, n_mask, n_ref;
      int64_t* ids = read_file(a, &n_ids);
      int64_t* mask = read_file(b, &n_mask);
      float* ref = read_file(c, &n_ref);
      float* out = malloc(n_ref);
      cf_status s = cf_encode(model, ids, mask, NULL, B, T, out, n_ref / sizeof(float), &error);
      expect(s, &error, CF_OK, NULL, line);
      if (s == CF_OK) compare_floats(out, ref, n_ref / sizeof(float), tolerant ? 1e-4 : 0.0, line);
      free(ids), free(mask), free(ref), free(out);
    } else if (strcmp(kind, "embed") == 0 && sscanf(line, "%*s %*s %zu %zu %ld %ld %255s %255s %255s %lf", &B, &T,
                                                    &pooling, &normalize, a, b, c, &tolerance) == 8) {
      size_t n_ids, n_mask, n_ref;
      int64_t* ids = read_file(a, &n_ids);
      int64_t* mask = read_file(b, &n_mask);
      float* ref = read_file(c, &n_ref);
      float* out = malloc(n_ref);
      cf_status s = cf_embed(model, ids, mask, B, T, (int)pooling, (int)normalize, out, n_ref / sizeof(float), &error);
      expect(s, &error, CF_OK, NULL, line);
      if (s == CF_OK) compare_floats(out, ref, n_ref / sizeof(float), tolerant ? 1e-4 : tolerance, line);
      free(ids), free(mask), free(ref), free(out);
    } else if (strcmp(kind, "generate") == 0 &&
               sscanf(line, "%*s %*s %255s %ld %ld %ld %ld %255s", a, &max_new, &beams, &sample, &seed, d) == 6) {
      size_t n_prompt, n_ref;
      int64_t* prompt = read_file(a, &n_prompt);
      int64_t* ref = read_file(d, &n_ref);
      cf_generate_options o;
      cf_generate_options_init(&o);
      o.max_new_tokens = max_new;
      o.num_beams = beams;
      o.do_sample = (int)sample;
      o.seed = (uint64_t)seed;
      int64_t out[256];
      size_t got = 0;
      cf_finish_reason finish;
      cf_status s =
          cf_generate(model, prompt, n_prompt / sizeof(int64_t), &o, NULL, NULL, out, 256, &got, &finish, &error);
      expect(s, &error, CF_OK, NULL, line);
      if (s == CF_OK && !tolerant) {
        CHECK(got == n_ref / sizeof(int64_t) && memcmp(out, ref, n_ref) == 0, "%s: %zu tokens differ from Python's %zu",
              line, got, n_ref / sizeof(int64_t));
      }
      free(prompt), free(ref);
    } else {
      CHECK(0, "cases.txt: cannot parse '%s'", line);
    }
    cf_model_free(model);
  }
  fclose(f);
  return count;
}

/* ---- error paths ---------------------------------------------------------------------------- */

static void test_open_errors(void) {
  cf_model* model = NULL;
  cf_error e;
  char path[4096];
  expect(cf_model_open(NULL, NULL, &model, &e), &e, CF_ERROR_INVALID_ARGUMENT, "path is NULL", "NULL path");
  CHECK(model == NULL, "a failed open leaves *model NULL");
  snprintf(path, sizeof(path), "%s/gpt2-int8", models_dir);
  expect(cf_model_open(path, NULL, NULL, &e), &e, CF_ERROR_INVALID_ARGUMENT, "model", "NULL output pointer");
  expect(cf_model_open("/nonexistent/cpuformer-model", NULL, &model, &e), &e, CF_ERROR_IO, "no such directory",
         "missing path");
  snprintf(path, sizeof(path), "%s/cases.txt", models_dir);
  expect(cf_model_open(path, NULL, &model, &e), &e, CF_ERROR_IO, "is not a directory", "a file");
  snprintf(path, sizeof(path), "%s/damaged/plain_undeclared", models_dir);
  expect(cf_model_open(path, NULL, &model, &e), &e, CF_ERROR_INVALID_MODEL, "is not an architecture the C API opens",
         "a plain directory of an image model");
  const char* damaged[][2] = {{"manifest_truncated", "JSON"},
                              {"weights_truncated", "model.safetensors"},
                              {"bad_version", "format_version 99"},
                              {"no_manifest", "has no cpuformer_graph.json"},
                              {"wrong_shape", "attn.o"},
                              {"unknown_field", "unknown field 'bogus'"},
                              {"unknown_option", "unknown option 'bogus'"},
                              {"bad_dtype", "unknown dtype 'int3'"},
                              {"bad_rows", "rows [0, 9999) outside"},
                              {"stored_dtype", "is stored as F32, expected int8"},
                              {"missing_tensor", "has no tensor 'nonexistent.weight'"},
                              {"layer_count", "stack 'decoder' has 1 layers"},
                              {"packed_truncated", "damaged packed-weights file: truncated or bad header"},
                              {"packed_bad_magic", "damaged packed-weights file: bad header (no CFPACKED magic)"},
                              {"packed_shape", "matrix 'decoder.layers.0.qkv' is [128, 32], the model's is [96, 32]"},
                              {"plain_stray", "tensors that GPT-2 models do not use: extra.weight"},
                              {"plain_missing_shard", "model-00002-of-00002.safetensors: no such file"},
                              {"plain_no_head", "has no lm_head.weight and tie_word_embeddings is false"},
                              {"plain_bad_config", "hidden_act 'relu' is not supported; the Llama family uses 'silu'"}};
  for (size_t i = 0; i < sizeof(damaged) / sizeof(damaged[0]); ++i) {
    snprintf(path, sizeof(path), "%s/damaged/%s", models_dir, damaged[i][0]);
    expect(cf_model_open(path, NULL, &model, &e), &e, CF_ERROR_INVALID_MODEL, damaged[i][1], damaged[i][0]);
    CHECK(model == NULL, "%s: *model stays NULL", damaged[i][0]);
  }
  cf_open_options o;
  cf_open_options_init(&o);
  snprintf(path, sizeof(path), "%s/gpt2-int8", models_dir);
  o.dtype = "int3";
  expect(cf_model_open(path, &o, &model, &e), &e, CF_ERROR_INVALID_ARGUMENT, "dtype must be", "bad dtype");
  o.dtype = "float32";
  expect(cf_model_open(path, &o, &model, &e), &e, CF_ERROR_INVALID_ARGUMENT, "was converted to dtype 'int8'",
         "dtype mismatch");
  // Refused before any weight is read: the truncated weights file is never opened.
  snprintf(path, sizeof(path), "%s/damaged/weights_truncated", models_dir);
  expect(cf_model_open(path, &o, &model, &e), &e, CF_ERROR_INVALID_ARGUMENT, "was converted to dtype 'int8'",
         "dtype mismatch, weights unread");
  snprintf(path, sizeof(path), "%s/gpt2-int8", models_dir);
  o.dtype = "int8";
  o.num_threads = -1;
  expect(cf_model_open(path, &o, &model, &e), &e, CF_ERROR_INVALID_ARGUMENT, "num_threads", "negative threads");
  o.num_threads = 1;
  expect(cf_model_open(path, &o, &model, &e), &e, CF_OK, NULL, "matching dtype");
  cf_model_free(model);
  expect(cf_set_num_threads(0, &e), &e, CF_ERROR_INVALID_ARGUMENT, "num_threads", "cf_set_num_threads(0)");
  expect(cf_set_float32_matmul_precision("medium", &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "float32 matmul precision must be 'highest' or 'high', got 'medium'", "precision 'medium'");
  expect(cf_set_float32_matmul_precision(NULL, &e), &e, CF_ERROR_INVALID_ARGUMENT, "got NULL", "precision NULL");
  expect(cf_set_float32_matmul_precision("high", &e), &e, CF_OK, NULL, "precision 'high'");
  expect(cf_set_float32_matmul_precision("highest", &e), &e, CF_OK, NULL, "precision 'highest'");
  CHECK(cf_model_open(NULL, NULL, &model, NULL) == CF_ERROR_INVALID_ARGUMENT, "error may be NULL");
}

static int stop_after_three(void* user, size_t index, int64_t token) {
  (void)index, (void)token;
  int* seen = (int*)user;
  return ++*seen >= 3;
}

static void test_call_errors(void) {
  cf_error e;
  cf_model* gpt2 = open_model("gpt2-int8");
  cf_model* bert = open_model("bert-float32");
  if (!gpt2 || !bert) return;
  cf_model_info info;
  expect(cf_model_get_info(gpt2, &info, &e), &e, CF_OK, NULL, "info");
  CHECK(info.kind == CF_DECODER && info.vocab_size == 97 && info.hidden_size == 32 && info.num_layers == 2 &&
            info.max_positions == 64 && strcmp(info.dtype, "int8") == 0 &&
            strcmp(info.architecture, "GPT2LMHeadModel") == 0,
        "info: kind %d vocab %lld hidden %lld dtype %s arch %s", info.kind, (long long)info.vocab_size,
        (long long)info.hidden_size, info.dtype, info.architecture);
  expect(cf_model_get_info(gpt2, NULL, &e), &e, CF_ERROR_INVALID_ARGUMENT, "info is NULL", "NULL info");

  int64_t ids[6] = {3, 4, 5, 6, 7, 8}, mask[6] = {1, 1, 1, 1, 1, 1};
  float out[6 * 32];
  expect(cf_encode(gpt2, ids, NULL, NULL, 1, 6, out, 6 * 32, &e), &e, CF_ERROR_WRONG_KIND, "cf_generate",
         "encode a decoder");
  expect(cf_encode(bert, NULL, NULL, NULL, 1, 6, out, 6 * 32, &e), &e, CF_ERROR_INVALID_ARGUMENT, "input_ids is NULL",
         "NULL ids");
  expect(cf_encode(bert, ids, NULL, NULL, 1, 6, out, 6 * 32 - 1, &e), &e, CF_ERROR_BUFFER_TOO_SMALL, "need 192",
         "small buffer");
  expect(cf_encode(bert, ids, NULL, NULL, 0, 6, out, 6 * 32, &e), &e, CF_ERROR_INVALID_ARGUMENT, ">= 1", "batch 0");
  ids[4] = 99;
  expect(cf_encode(bert, ids, NULL, NULL, 1, 6, out, 6 * 32, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "input_ids[0, 4] = 99 is out of range", "id out of range");
  ids[4] = 7;
  mask[2] = 2;
  expect(cf_encode(bert, ids, mask, NULL, 1, 6, out, 6 * 32, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "attention_mask[0, 2] = 2", "mask value");
  mask[2] = 1;
  int64_t long_ids[65] = {0};
  float* big = malloc(sizeof(float) * 65 * 32);
  expect(cf_encode(bert, long_ids, NULL, NULL, 1, 65, big, 65 * 32, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "exceeds the model's maximum of 64", "too long");
  free(big);
  expect(cf_embed(bert, ids, mask, 1, 6, 9, 1, out, 32, &e), &e, CF_ERROR_INVALID_ARGUMENT, "pooling must be",
         "bad pooling");
  expect(cf_embed(bert, ids, mask, 1, 6, CF_POOL_MEAN, 1, out, 31, &e), &e, CF_ERROR_BUFFER_TOO_SMALL, "need 32",
         "small embedding buffer");
  expect(cf_embed(bert, ids, mask, 1, 6, CF_POOL_MEAN, 1, out, 32, &e), &e, CF_OK, NULL, "embed");

  int64_t tokens[64];
  size_t count = 99;
  cf_finish_reason finish;
  cf_generate_options o;
  cf_generate_options_init(&o);
  expect(cf_generate(bert, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_WRONG_KIND, "encoder",
         "generate on an encoder");
  CHECK(count == 0, "a failed generate sets *out_count to 0");
  expect(cf_generate(gpt2, NULL, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "prompt is NULL", "NULL prompt");
  expect(cf_generate(gpt2, ids, 0, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "prompt_len", "empty prompt");
  /* The option rules and messages are the Python API's (csrc/models/request_checks.h). */
  o.max_new_tokens = -1;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "max_new_tokens must be an integer >= 0, got -1", "max_new_tokens -1");
  o.max_new_tokens = 0; /* as generate(max_new_tokens=0): no new token */
  count = 99;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_OK, NULL,
         "max_new_tokens 0");
  CHECK(count == 0 && finish == CF_FINISH_LENGTH, "max_new_tokens 0 makes no token and finishes by length");
  cf_generate_options_init(&o);
  o.min_new_tokens = -3;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "min_new_tokens must be an integer >= 0, got -3", "min_new_tokens -3");
  cf_generate_options_init(&o);
  o.top_k = -1;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "top_k must be an integer >= 0 (0 disables it), got -1", "top_k -1");
  cf_generate_options_init(&o);
  o.num_beams = 0;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "num_beams must be an integer >= 1, got 0", "num_beams 0");
  cf_generate_options_init(&o);
  o.no_repeat_ngram_size = -2;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "no_repeat_ngram_size must be an integer >= 0, got -2", "no_repeat_ngram_size -2");
  cf_generate_options_init(&o);
  o.repetition_penalty = 0;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "repetition_penalty must be > 0, got 0.0", "repetition_penalty 0");
  cf_generate_options_init(&o);
  o.length_penalty = -INFINITY;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "length_penalty must be a finite number, got -inf", "length_penalty -inf");
  cf_generate_options_init(&o);
  o.max_new_tokens = 60;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "exceeds the model's maximum of 64", "too many new tokens");
  cf_generate_options_init(&o);
  o.top_p = 2;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "top_p must be in (0, 1], got 2.0", "top_p 2");
  cf_generate_options_init(&o);
  o.do_sample = 1;
  o.temperature = 0;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "temperature must be > 0 when sampling, got 0.0", "temperature 0");
  o.temperature = NAN;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "temperature must be a finite number, got nan", "temperature NaN");
  o.temperature = 1;
  o.num_beams = 2;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "beam sampling (do_sample with num_beams > 1) is not supported", "beam sampling");
  cf_generate_options_init(&o);
  int64_t eos = 500;
  o.eos_token_ids = &eos;
  o.eos_count = 1;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "eos_token_id 500 is out of range", "eos out of range");
  o.eos_token_ids = NULL;
  o.eos_count = 3;
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_INVALID_ARGUMENT,
         "eos_token_ids", "eos count without ids");
  cf_generate_options_init(&o);
  o.max_new_tokens = 10;
  o.eos_token_ids = &eos;
  o.eos_count = 0; /* no EOS: exactly max_new_tokens */
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 4, &count, &finish, &e), &e, CF_ERROR_BUFFER_TOO_SMALL,
         "made 10", "small token buffer");
  CHECK(count == 10, "BUFFER_TOO_SMALL reports the tokens made: %zu", count);
  int seen = 0;
  expect(cf_generate(gpt2, ids, 6, &o, stop_after_three, &seen, tokens, 64, &count, &finish, &e), &e, CF_OK, NULL,
         "callback stop");
  CHECK(count == 3 && seen == 3 && finish == CF_FINISH_STOPPED, "callback stop: %zu tokens, %d calls, finish %d", count,
        seen, finish);
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_OK, NULL, "no EOS");
  CHECK(count == 10 && finish == CF_FINISH_LENGTH, "no EOS: %zu tokens, finish %d", count, finish);

  expect(cf_model_close(gpt2, &e), &e, CF_OK, NULL, "close");
  expect(cf_model_close(gpt2, &e), &e, CF_OK, NULL, "close twice");
  expect(cf_generate(gpt2, ids, 6, &o, NULL, NULL, tokens, 64, &count, &finish, &e), &e, CF_ERROR_CLOSED, "closed",
         "generate after close");
  expect(cf_model_get_info(gpt2, &info, &e), &e, CF_ERROR_CLOSED, "closed", "info after close");
  expect(cf_encode(NULL, ids, NULL, NULL, 1, 6, out, 192, &e), &e, CF_ERROR_INVALID_ARGUMENT, "model is NULL",
         "NULL model");
  cf_model_free(gpt2);
  cf_model_free(bert);
  cf_model_free(NULL);
  CHECK(strlen(cf_version()) > 0 && strcmp(cf_status_name(CF_ERROR_BUSY), "CF_ERROR_BUSY") == 0, "version, names");
}

/* Two threads, one model: the second call while the first runs gets CF_ERROR_BUSY. */
struct shared {
  cf_model* model;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  int inside, done;
  cf_status second;
  char message[1024];
};

static int hold_until_done(void* user, size_t index, int64_t token) {
  (void)index, (void)token;
  struct shared* s = (struct shared*)user;
  pthread_mutex_lock(&s->lock);
  s->inside = 1;
  pthread_cond_broadcast(&s->changed);
  while (!s->done) pthread_cond_wait(&s->changed, &s->lock);
  pthread_mutex_unlock(&s->lock);
  return 1; /* stop after the first token */
}

static void* second_caller(void* arg) {
  struct shared* s = (struct shared*)arg;
  pthread_mutex_lock(&s->lock);
  while (!s->inside) pthread_cond_wait(&s->changed, &s->lock);
  pthread_mutex_unlock(&s->lock);
  int64_t ids[3] = {3, 4, 5}, tokens[8];
  size_t count;
  cf_error e;
  s->second = cf_generate(s->model, ids, 3, NULL, NULL, NULL, tokens, 8, &count, NULL, &e);
  snprintf(s->message, sizeof(s->message), "%s", e.message);
  pthread_mutex_lock(&s->lock);
  s->done = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static void test_two_threads(void) {
  struct shared s;
  memset(&s, 0, sizeof(s));
  s.model = open_model("llama-float32");
  if (!s.model) return;
  pthread_mutex_init(&s.lock, NULL);
  pthread_cond_init(&s.changed, NULL);
  pthread_t thread;
  pthread_create(&thread, NULL, second_caller, &s);
  int64_t ids[3] = {3, 4, 5}, tokens[8];
  size_t count;
  cf_error e;
  expect(cf_generate(s.model, ids, 3, NULL, hold_until_done, &s, tokens, 8, &count, NULL, &e), &e, CF_OK, NULL,
         "first thread");
  pthread_join(thread, NULL);
  CHECK(s.second == CF_ERROR_BUSY && strstr(s.message, "another thread") != NULL, "second thread: %s (%s)",
        cf_status_name(s.second), s.message);
  pthread_mutex_destroy(&s.lock);
  pthread_cond_destroy(&s.changed);
  cf_model_free(s.model);
}

/* A plain Hugging Face directory reports the dtype it was opened in. */
static void test_plain_info(void) {
  cf_error e;
  cf_model* llama = open_model("hf/llama@int4");
  if (!llama) return;
  cf_model_info info;
  expect(cf_model_get_info(llama, &info, &e), &e, CF_OK, NULL, "plain info");
  CHECK(info.kind == CF_DECODER && info.vocab_size == 101 && strcmp(info.dtype, "int4") == 0 &&
            strcmp(info.architecture, "LlamaForCausalLM") == 0,
        "plain info: kind %d vocab %lld dtype %s arch %s", info.kind, (long long)info.vocab_size, info.dtype,
        info.architecture);
  cf_model_free(llama);
}

int main(int argc, char** argv) {
  if (argc < 2 || access(argv[1], F_OK) != 0) {
    fprintf(stderr, "usage: %s MODELS [--tolerant] (MODELS: written by tests/c/make_cases.py)\n", argv[0]);
    return 77;
  }
  models_dir = argv[1];
  tolerant = argc > 2 && strcmp(argv[2], "--tolerant") == 0;
  int cases = run_cases();
  CHECK(cases > 0, "no cases in %s/cases.txt", models_dir);
  test_open_errors();
  test_call_errors();
  test_plain_info();
  test_two_threads();
  printf("capi_tests: %d output cases, %s\n", cases, failures ? "FAILED" : "passed");
  if (failures) fprintf(stderr, "%d failures\n", failures);
  return failures ? 1 : 0;
}
