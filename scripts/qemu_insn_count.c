/* A QEMU TCG plugin that counts the guest instructions a program executes, by mnemonic.
 *
 * Used by benchmarks/arm_instruction_model.py to count what cpuformer's AArch64 kernels execute
 * under qemu-aarch64 (docs/arm.md, "Expected speed on ARM hardware"). Built for the host:
 *
 *   cc -shared -fPIC -O2 -o build/qemu_insn_count.so scripts/qemu_insn_count.c -lpthread
 *   qemu-aarch64 -plugin build/qemu_insn_count.so,out=counts.tsv ./program
 *
 * At exit it writes "<key>\t<count>" lines, sorted by count, to `out` (stderr without it). A key
 * is an instruction's mnemonic and its first operand's register class (key_of() below), or
 * "enc <hex>" for an instruction QEMU cannot disassemble. Counting
 * is an inline add per executed instruction into the counter of its key, looked up once when QEMU
 * translates a block. The adds are not atomic: run single-threaded guests (OMP_NUM_THREADS=1).
 *
 * The QEMU plugin API (include/qemu/qemu-plugin.h of QEMU) is not packaged by Debian, so the few
 * declarations used are written here. They follow plugin API version 1, the version of the QEMU
 * 7.2 that Debian 12 ships, which QEMU checks through the exported qemu_plugin_version. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the plugin API used (QEMU plugin API version 1) ---- */
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t; /* only passed through */
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb* tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void* userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
struct qemu_plugin_insn* qemu_plugin_tb_get_insn(const struct qemu_plugin_tb* tb, size_t idx);
char* qemu_plugin_insn_disas(const struct qemu_plugin_insn* insn);
const void* qemu_plugin_insn_data(const struct qemu_plugin_insn* insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn* insn);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn* insn, enum qemu_plugin_op op, void* ptr,
                                                uint64_t imm);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void* userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* ---- mnemonic -> counter (open addressing; counters never move once handed out) ---- */
enum { kSlots = 1 << 14, kMnemonic = 24 };
struct slot {
  char mnemonic[kMnemonic];
  uint64_t count;
};
static struct slot* slots;
static size_t used;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char out_path[4096];

// The key of an instruction: its mnemonic and its first operand's register class, with the register
// number dropped ("fmla v.4s", "ldr q", "add x", "fmadd s", "b.ne"), which tells the SIMD and
// floating-point instructions and their arrangement from the general-purpose ones.
static void key_of(const char* disassembly, char* key) {
  size_t n = strcspn(disassembly, " \t"), k = 0;
  for (size_t i = 0; i < n && k + 1 < kMnemonic; ++i) key[k++] = disassembly[i];
  const char* op = disassembly + n;
  while (*op == ' ' || *op == '\t') ++op;
  if (*op && strchr("vqdshbxwz", *op) && op[1] >= '0' && op[1] <= '9' && k + 2 < kMnemonic) {
    key[k++] = ' ';
    key[k++] = *op;
    const char* end = op + strcspn(op, ", \t{}[]");
    const char* dot = memchr(op, '.', (size_t)(end - op));
    for (const char* c = dot; c && c < end && k + 1 < kMnemonic; ++c) key[k++] = *c;
  }
  key[k] = 0;
}

static uint64_t* counter_for(const char* key) {
  char mnemonic[kMnemonic] = {0};
  snprintf(mnemonic, sizeof(mnemonic), "%s", key);
  const size_t n = strlen(mnemonic);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ (unsigned char)mnemonic[i]) * 1099511628211ull;
  for (size_t probe = 0; probe < kSlots; ++probe) {
    struct slot* s = &slots[(h + probe) & (kSlots - 1)];
    if (s->mnemonic[0] == 0) {
      if (used + 1 >= kSlots) break;
      memcpy(s->mnemonic, mnemonic, kMnemonic);
      ++used;
      return &s->count;
    }
    if (strcmp(s->mnemonic, mnemonic) == 0) return &s->count;
  }
  return &slots[0].count; /* table full: cannot happen with < 16k mnemonics; lumped, not lost */
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  const size_t n = qemu_plugin_tb_n_insns(tb);
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n; ++i) {
    struct qemu_plugin_insn* insn = qemu_plugin_tb_get_insn(tb, i);
    char* text = qemu_plugin_insn_disas(insn);
    uint64_t* counter;
    if ((!text || strncmp(text, ".byte", 5) == 0) && qemu_plugin_insn_size(insn) == 4) {
      // An encoding QEMU's disassembler does not name (its AArch64 disassembler predates SDOT,
      // SMMLA, BFMMLA...): keyed by the word without its three register fields, "enc 4e809400".
      uint32_t word;
      memcpy(&word, qemu_plugin_insn_data(insn), 4);
      char key[kMnemonic];
      snprintf(key, sizeof(key), "enc %08x", word & ~(0x1Fu | 0x1Fu << 5 | 0x1Fu << 16));
      counter = counter_for(key);
    } else {
      char key[kMnemonic];
      key_of(text ? text : "?", key);
      counter = counter_for(key);
    }
    free(text);
    qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, counter, 1);
  }
  pthread_mutex_unlock(&lock);
}

static int by_count(const void* a, const void* b) {
  const struct slot *x = a, *y = b;
  return x->count < y->count ? 1 : x->count > y->count ? -1 : strcmp(x->mnemonic, y->mnemonic);
}

static void on_exit_(qemu_plugin_id_t id, void* userdata) {
  (void)id;
  (void)userdata;
  qsort(slots, kSlots, sizeof(struct slot), by_count);
  FILE* f = out_path[0] ? fopen(out_path, "w") : stderr;
  if (!f) {
    fprintf(stderr, "qemu_insn_count: cannot write %s\n", out_path);
    return;
  }
  for (size_t i = 0; i < kSlots && slots[i].count; ++i)
    fprintf(f, "%s\t%llu\n", slots[i].mnemonic, (unsigned long long)slots[i].count);
  if (f != stderr) fclose(f);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc,
                                                               char** argv) {
  (void)info;
  for (int i = 0; i < argc; ++i) {
    if (strncmp(argv[i], "out=", 4) == 0) {
      snprintf(out_path, sizeof(out_path), "%s", argv[i] + 4);
    } else {
      fprintf(stderr, "qemu_insn_count: unknown argument %s (expected out=FILE)\n", argv[i]);
      return -1;
    }
  }
  slots = calloc(kSlots, sizeof(struct slot));
  if (!slots) return -1;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, on_exit_, NULL);
  return 0;
}
