#!/usr/bin/env python3
"""Writes tests/fixtures/encoders/: small encoder folders that transformers and
sentence-transformers wrote themselves (seeded random weights, hidden 32, 2 layers,
f32), each with reference.json holding the embeddings sentence-transformers `encode`
computed from the saved folder for fixed texts, and PEFT adapter folders that `peft`
saved, with what the model computes with the adapter applied.

tests/encoder_reference.rs and tests/lora_peft.rs read these files; only this script
needs PyTorch:

    python3 -m venv /work/venv
    /work/venv/bin/pip install torch transformers sentence-transformers peft
    /work/venv/bin/python scripts/make-encoder-fixtures.py

The folders:
- bert-mean: the layout of the Hub's sentence-transformers folders (all-MiniLM-L6-v2):
  `sentence_bert_config.json` with `max_seq_length` 24 and `do_lower_case` (the
  tokenizer itself is cased and its vocabulary lower-case, so the lower-casing shows),
  the old `pooling_mode_mean_tokens` flag, 2_Normalize, and a tokenizer.json that pads
  every text to 40 and truncates at 16, as MiniLM's pads to 128 and truncates at 128
  where sentence-transformers takes 256: sentence-transformers ignores both.
- bert-cls-max: sentence-transformers 5's own layout (`pooling_mode` ["cls", "max"],
  the length as `model_max_length` in tokenizer_config.json), no Normalize.
- bert-sqrt-weighted-last: mean_sqrt_len_tokens + weightedmean + lasttoken, normalised.
- roberta: a RobertaModel (positions from pad_token_id + 1; a byte-level BPE
  tokenizer), mean pooling, normalised, max_seq_length 20.
- xlm-roberta: an XLMRobertaModel (model_type `xlm-roberta`), CLS pooling.
- peft-bert: a LoRA adapter on bert-mean's query/value (rsLoRA scaling), saved by peft,
  with the embeddings sentence-transformers computes with the adapter merged.
- peft-llama3: a LoRA adapter on tests/fixtures/decoders/llama3's q/k/v/o projections,
  saved by peft, with the logits and 16 greedy tokens the adapted model computes.

Every text of TEXTS is embedded in batches of BATCH, so batches mix lengths; at least
one text is longer than each folder's length and is truncated there.
"""

import importlib.util
import json
import pathlib
import shutil

import torch
import transformers
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertModel,
    BertTokenizerFast,
    RobertaConfig,
    RobertaModel,
    RobertaTokenizerFast,
    XLMRobertaConfig,
    XLMRobertaModel,
)
import peft
import sentence_transformers
from sentence_transformers import SentenceTransformer, models

REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = REPO / "tests" / "fixtures" / "encoders"
LLAMA = REPO / "tests" / "fixtures" / "decoders" / "llama3"
BATCH = 3
WORDS = (
    "the a man woman is are eating food piece of bread at table today movie new awesome "
    "cat dog sat on mat and with to in it was very good bad quick brown fox jumps over lazy "
    "people watch from far away talk about weather"
).split()
TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "Hi.",
    "The Cat sat on the mat with a dog, and it was very good.",
    # Longer than every folder's max length.
    " ".join(["the quick brown fox jumps over the lazy dog"] * 5) + ".",
    "People watch the weather from far away.",
    "A woman is eating bread at the table today and talking about a new movie with people.",
]
HIDDEN = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)

def decoder_fixtures():
    """scripts/make-decoder-fixtures.py as a module: its prompt, steps and greedy loop
    are the ones the llama3 fixture's reference was made with."""
    spec = importlib.util.spec_from_file_location(
        "make_decoder_fixtures", REPO / "scripts" / "make-decoder-fixtures.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DECODERS = decoder_fixtures()
PROMPT = DECODERS.PROMPT
greedy = DECODERS.greedy


def randomise(model, seed):
    """Seeded weights wider than the default initialisation, so the embeddings differ
    clearly between texts and modes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))


def bert_tokenizer(folder):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz.,!?")
    vocab += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz.,"] + WORDS
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # Cased: upper-case letters are unknown unless do_lower_case lower-cases them.
    tokenizer = BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=False)
    (folder / "vocab.txt").unlink()
    return tokenizer, len(vocab)


def roberta_tokenizer(folder):
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        TEXTS + [" ".join(WORDS)] * 4,
        vocab_size=300,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))
    tokenizer = RobertaTokenizerFast(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    (folder / "vocab.json").unlink()
    (folder / "merges.txt").unlink()
    return tokenizer, bpe.get_vocab_size()


def save_transformer(folder, kind, seed):
    """A seeded encoder of `kind` (bert, roberta, xlm-roberta) and its tokenizer, saved
    by transformers into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "bert":
        tokenizer, vocab = bert_tokenizer(folder)
        config = BertConfig(vocab_size=vocab, max_position_embeddings=48, **HIDDEN)
        model = BertModel(config, add_pooling_layer=False)
    else:
        tokenizer, vocab = roberta_tokenizer(folder)
        classes = {"roberta": (RobertaConfig, RobertaModel), "xlm-roberta": (XLMRobertaConfig, XLMRobertaModel)}
        config_class, model_class = classes[kind]
        config = config_class(
            vocab_size=vocab, max_position_embeddings=48 + 2, type_vocab_size=1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, **HIDDEN
        )
        model = model_class(config, add_pooling_layer=False)
    randomise(model, seed)
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def sentence_folder(name, kind, seed, max_length, pooling, normalize, layout="hub", lower=False):
    folder = ROOT / name
    shutil.rmtree(folder, ignore_errors=True)
    save_transformer(folder, kind, seed)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    (folder / "1_Pooling").mkdir()
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    if layout == "hub":
        flags = {
            "pooling_mode_cls_token": "cls",
            "pooling_mode_mean_tokens": "mean",
            "pooling_mode_max_tokens": "max",
            "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens": "weightedmean",
            "pooling_mode_lasttoken": "lasttoken",
        }
        pool = {"word_embedding_dimension": HIDDEN["hidden_size"]}
        pool.update({flag: mode in pooling for flag, mode in flags.items()})
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_length, "do_lower_case": lower}, indent=2)
        )
    else:
        pool = {"embedding_dimension": HIDDEN["hidden_size"], "pooling_mode": pooling, "include_prompt": True}
        config_path = folder / "tokenizer_config.json"
        tokenizer_config = json.loads(config_path.read_text())
        tokenizer_config["model_max_length"] = max_length
        config_path.write_text(json.dumps(tokenizer_config, indent=2))
        (folder / "sentence_bert_config.json").write_text(json.dumps({
            "transformer_task": "feature-extraction",
            "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
            "module_output_name": "token_embeddings",
        }, indent=2))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pool, indent=2))
    if normalize:
        (folder / "2_Normalize").mkdir()
        (folder / "2_Normalize" / "config.json").write_text("{}")
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    if name == "bert-mean":
        # MiniLM's tokenizer.json pads to a fixed length and truncates below
        # max_seq_length; sentence-transformers ignores both.
        path = folder / "tokenizer.json"
        spec = json.loads(path.read_text())
        spec["truncation"] = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
        spec["padding"] = {"strategy": {"Fixed": 40}, "direction": "Right", "pad_to_multiple_of": None,
                           "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
        path.write_text(json.dumps(spec))
    return folder


def encode(folder, texts=TEXTS, adapter=None):
    model = SentenceTransformer(str(folder), device="cpu")
    if adapter is not None:
        transformer = model[0]
        transformer.model = peft.PeftModel.from_pretrained(transformer.model, str(adapter)).merge_and_unload()
    tokens = [model.tokenize([text])["input_ids"][0].tolist() for text in texts]
    embeddings = model.encode(texts, batch_size=BATCH, convert_to_tensor=True).to(torch.float32)
    return model, tokens, embeddings


def write_reference(folder, model, tokens, embeddings, extra=None):
    max_length = model.max_seq_length
    reference = {
        "made_by": f"sentence-transformers {sentence_transformers.__version__}, transformers {transformers.__version__}, torch {torch.__version__}",
        "batch": BATCH,
        "max_seq_length": max_length,
        "texts": TEXTS,
        "token_ids": tokens,
        "truncated": [len(model.tokenizer(text, truncation=False)["input_ids"]) > max_length for text in TEXTS],
        "embeddings": [[float(f"{value:.9g}") for value in row.tolist()] for row in embeddings],
    }
    reference.update(extra or {})
    assert any(reference["truncated"]), f"{folder.name}: no text reaches max_seq_length"
    (folder / "reference.json").write_text(json.dumps(reference) + "\n")
    print(f"{folder.name}: {embeddings.shape[1]} values per text, token counts {[len(t) for t in tokens]}")


def peft_bert():
    base = ROOT / "bert-mean"
    adapter = ROOT / "peft-bert"
    shutil.rmtree(adapter, ignore_errors=True)
    model = SentenceTransformer(str(base), device="cpu")
    config = peft.LoraConfig(r=4, lora_alpha=8, use_rslora=True, target_modules=["query", "value"],
                             lora_dropout=0.1, init_lora_weights=False, bias="none")
    torch.manual_seed(11)
    peft_model = peft.get_peft_model(model[0].model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.mul_(4.0)
    peft_model.save_pretrained(str(adapter))
    name_base(adapter, "bert-mean")
    _, tokens, embeddings = encode(base, adapter=adapter)
    _, _, plain = encode(base)
    assert float((embeddings - plain).abs().max()) > 1e-2, "the adapter changes too little"
    write_reference(adapter, model, tokens, embeddings, {"base": "bert-mean"})


def name_base(adapter, name):
    """peft records the base by the path it was loaded from (here an absolute path of
    this machine); the fixture records the base folder's name, as the Hub's name ends."""
    config_path = adapter / "adapter_config.json"
    saved = json.loads(config_path.read_text())
    saved["base_model_name_or_path"] = name
    # peft keeps target_modules as a set: sorted, the file is the same on every run.
    if isinstance(saved.get("target_modules"), list):
        saved["target_modules"] = sorted(saved["target_modules"])
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True))


def peft_llama():
    adapter = ROOT / "peft-llama3"
    shutil.rmtree(adapter, ignore_errors=True)
    base = AutoModelForCausalLM.from_pretrained(str(LLAMA), attn_implementation="eager").eval()
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                             init_lora_weights=False, task_type="CAUSAL_LM")
    torch.manual_seed(12)
    model = peft.get_peft_model(base, config)
    model.save_pretrained(str(adapter))
    name_base(adapter, "llama3")
    fresh = AutoModelForCausalLM.from_pretrained(str(LLAMA), attn_implementation="eager").eval()
    adapted = peft.PeftModel.from_pretrained(fresh, str(adapter)).eval()
    logits, tokens = greedy(adapted)
    plain_logits, _ = greedy(AutoModelForCausalLM.from_pretrained(str(LLAMA), attn_implementation="eager").eval())
    moved = max(float((a - b).abs().max()) for a, b in zip(logits, plain_logits))
    assert moved > 1e-2, f"the adapter moves the logits only {moved}"
    reference = {
        "made_by": f"peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}",
        "base": "tests/fixtures/decoders/llama3",
        "prompt": PROMPT,
        "tokens": tokens,
        "logits": [[float(f"{value:.9g}") for value in row.tolist()] for row in logits],
    }
    (adapter / "reference.json").write_text(json.dumps(reference) + "\n")
    print(f"peft-llama3: tokens {tokens}, logits moved by the adapter up to {moved:.3f}")


def main():
    torch.set_num_threads(2)
    ROOT.mkdir(parents=True, exist_ok=True)
    folders = [
        sentence_folder("bert-mean", "bert", 1, 24, ["mean"], True, lower=True),
        sentence_folder("bert-cls-max", "bert", 2, 20, ["cls", "max"], False, layout="v5"),
        sentence_folder("bert-sqrt-weighted-last", "bert", 3, 22,
                        ["mean_sqrt_len_tokens", "weightedmean", "lasttoken"], True),
        sentence_folder("roberta", "roberta", 4, 20, ["mean"], True),
        sentence_folder("xlm-roberta", "xlm-roberta", 5, 18, ["cls"], False, layout="v5"),
    ]
    for folder in folders:
        model, tokens, embeddings = encode(folder)
        write_reference(folder, model, tokens, embeddings)
    peft_bert()
    peft_llama()
    for adapter in ("peft-bert", "peft-llama3"):
        # peft's model card, empty for a random adapter.
        (ROOT / adapter / "README.md").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
