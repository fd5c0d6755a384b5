/* Sentence embeddings from C: opens a converted encoder (`cpuformer convert MODEL OUT --dtype
 * int8`) and prints the mean-pooled, L2-normalised embedding of each token-id sequence given on
 * the command line (comma-separated ids, e.g. from a tokenizer), and their cosine similarity.
 *
 *   embed MODEL_DIR 101,7592,2088,102 101,7592,2154,102 */
#include <cpuformer.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_ids(const char* text, int64_t* ids, size_t capacity) {
  size_t n = 0;
  const char* p = text;
  while (*p && n < capacity) {
    char* end;
    ids[n++] = strtoll(p, &end, 10);
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return n;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL_DIR IDS [IDS ...]\n", argv[0]);
    return 2;
  }
  cf_error error;
  cf_model* model = NULL;
  if (cf_model_open(argv[1], NULL, &model, &error) != CF_OK) {
    fprintf(stderr, "%s: %s\n", cf_status_name(error.status), error.message);
    return 1;
  }
  cf_model_info info;
  cf_model_get_info(model, &info, &error);
  const size_t batch = (size_t)(argc - 2), hidden = (size_t)info.hidden_size;
  /* One padded batch: ids and a 0/1 mask [batch, longest]. */
  size_t longest = 0, lengths[64];
  int64_t rows[64][512];
  for (size_t b = 0; b < batch && b < 64; ++b) {
    lengths[b] = parse_ids(argv[2 + b], rows[b], 512);
    if (lengths[b] > longest) longest = lengths[b];
  }
  int64_t* ids = calloc(batch * longest, sizeof(int64_t));
  int64_t* mask = calloc(batch * longest, sizeof(int64_t));
  for (size_t b = 0; b < batch; ++b) {
    for (size_t t = 0; t < lengths[b]; ++t) {
      ids[b * longest + t] = rows[b][t];
      mask[b * longest + t] = 1;
    }
  }
  float* embeddings = malloc(batch * hidden * sizeof(float));
  if (cf_embed(model, ids, mask, batch, longest, CF_POOL_MEAN, 1, embeddings, batch * hidden, &error) != CF_OK) {
    fprintf(stderr, "%s: %s\n", cf_status_name(error.status), error.message);
    return 1;
  }
  for (size_t b = 0; b < batch; ++b) {
    printf("embedding %zu: [%.4f, %.4f, %.4f, ...] (%zu values)\n", b, embeddings[b * hidden],
           embeddings[b * hidden + 1], embeddings[b * hidden + 2], hidden);
  }
  if (batch >= 2) {
    double dot = 0;
    for (size_t j = 0; j < hidden; ++j) dot += (double)embeddings[j] * embeddings[hidden + j];
    printf("cosine(0, 1) = %.4f\n", dot);
  }
  free(ids), free(mask), free(embeddings);
  cf_model_free(model);
  return 0;
}
