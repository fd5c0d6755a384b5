/* Streaming generation from C: opens a converted decoder or encoder-decoder and prints each new
 * token id as it is generated (a tokenizer turns them into text), stopping after --max tokens.
 *
 *   generate MODEL_DIR 15496,995 [--max 20] [--sample SEED] */
#include <cpuformer.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int on_token(void* user, size_t index, int64_t token) {
  (void)index;
  printf(" %lld", (long long)token);
  fflush(stdout);
  ++*(int*)user;
  return 0; /* non-zero would stop the generation here */
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL_DIR PROMPT_IDS [--max N] [--sample SEED]\n", argv[0]);
    return 2;
  }
  int64_t prompt[1024];
  size_t length = 0;
  for (char* p = argv[2]; *p && length < 1024;) {
    char* end;
    prompt[length++] = strtoll(p, &end, 10);
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  cf_generate_options options;
  cf_generate_options_init(&options);
  for (int i = 3; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--max") == 0) options.max_new_tokens = atoll(argv[i + 1]);
    if (strcmp(argv[i], "--sample") == 0) options.do_sample = 1, options.seed = strtoull(argv[i + 1], NULL, 10);
  }
  cf_error error;
  cf_model* model = NULL;
  if (cf_model_open(argv[1], NULL, &model, &error) != CF_OK) {
    fprintf(stderr, "%s: %s\n", cf_status_name(error.status), error.message);
    return 1;
  }
  int64_t* tokens = malloc(sizeof(int64_t) * (size_t)options.max_new_tokens);
  size_t count = 0;
  int streamed = 0;
  cf_finish_reason finish;
  printf("tokens:");
  cf_status status = cf_generate(model, prompt, length, &options, on_token, &streamed, tokens,
                                 (size_t)options.max_new_tokens, &count, &finish, &error);
  printf("\n");
  if (status != CF_OK) {
    fprintf(stderr, "%s: %s\n", cf_status_name(status), error.message);
    return 1;
  }
  printf("%zu tokens (%d streamed), finished by %s\n", count, streamed,
         finish == CF_FINISH_EOS      ? "EOS"
         : finish == CF_FINISH_LENGTH ? "length"
                                      : "the callback");
  free(tokens);
  cf_model_free(model);
  return 0;
}
