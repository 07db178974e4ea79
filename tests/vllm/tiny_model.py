"""A tiny Llama and its tokenizer, made offline: seeded random weights, a tokenizer trained on
generated text. Loads in vLLM (CPU) and transformers from a local directory; nothing is downloaded.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS_SEED = 1234
VOCAB_SIZE = 512


def _corpus(n_lines: int = 2000, seed: int = WORDS_SEED) -> list[str]:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "tu", "ra", "so", "vi", "de", "po", "gu", "ze", "ha", "ji"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(n_lines)]


def build_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)


def build_tiny_llama(
    path: Path,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Write the model (fp32; by default head size 32, the smallest the CPU attention kernel takes)
    to `path`. Larger shapes make the benchmark's bigger models."""
    return _write_llama(Path(path), _llama_config(layers, hidden, heads, kv_heads, intermediate, max_positions), seed)


def build_tiny_hybrid(path: Path, layer_types: list[str], sliding_window: int, **shape: int) -> Path:
    """A hybrid tiny Llama: `layer_types` ("full_attention" / "sliding_attention", one per layer)
    with a `sliding_window` in tokens. vLLM gives its sliding-window and full-attention layers
    separate KV cache groups. `shape`: build_tiny_llama's other sizes."""
    seed = shape.pop("seed", 0)
    config = _llama_config(len(layer_types), **shape)
    config.layer_types = list(layer_types)
    config.sliding_window = sliding_window
    return _write_llama(Path(path), config, seed)


def _llama_config(
    layers: int,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 4096,
) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        dtype="float32",
    )


def _write_llama(path: Path, config: Any, seed: int) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(path)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    std = min(0.08, 1.0 / config.hidden_size**0.5)
    with torch.no_grad():  # larger weights than the default init: sharper, input-dependent logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    model.save_pretrained(path, safe_serialization=True)
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return path


def prompt_ids(n: int, seed: int) -> list[int]:
    """`n` token ids, never special ones (ids 0-2), reproducible from `seed`."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def prompt_text(words: int, seed: int) -> str:
    """`words` words of the tokenizer's training language (about 1.2 tokens a word), from `seed`."""
    rng = random.Random(seed)
    vocabulary = " ".join(_corpus()).split()
    return " ".join(rng.choice(vocabulary) for _ in range(words))


if __name__ == "__main__":
    import sys

    print(build_tiny_llama(Path(sys.argv[1])))
