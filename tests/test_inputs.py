"""Questions and passages are tokenised as DPR and TASER tokenise them (`taser.models.inputs`):
a titled passage is the pair (title, text) truncated longest-first by the slow tokenizer's rule,
token type ids all zero; a question is normalised (’ -> ') first. The references are built as
DPR's `text_to_tensor` builds them with transformers 4.x's slow tokenizer (its truncation loop
written out here), not with this library's functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model_cfg
from dpr_reference import dpr_ids as reference_ids
from dpr_reference import slow_truncate_longest_first
from transformers import AutoModel, BertConfig

from taser.data.passages import Passage
from taser.models import unpad as _unpad  # noqa: F401  (registers the padding-free attention)
from taser.models.biencoder import BiEncoder
from taser.models.config import BiEncoderConfig
from taser.models.encoding import encode_passages, encode_questions, encode_texts
from taser.models.inputs import longest_first, normalize_question, passage_ids, passage_string, tokenize_passages, tokenize_questions
from taser.models.loading import load_model
from taser.retrieval.dense import dense_retrieve
from taser.training.batching import Example, collate

PASSAGES = [
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601."),
    ("", "Paris is the capital and most populous city of France."),
    ("   ", "A title of spaces is a title, as DPR's `if title:` reads it."),
    ("Tesla, Inc.", "Tesla  is an American  electric vehicle company.\n"),
]
LONG_TITLE = " ".join(["The Very Long Title of a Wikipedia Article about the History of Norman Conquests"] * 3)
LONG_TEXT = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in France. " * 3


def dpr_ids(tokenizer, title: str, text: str, max_length: int) -> list[int]:
    """DPR's and TASER's `text_to_tensor(text, title)` (before padding), with their slow tokenizer."""
    return reference_ids(tokenizer, title, text.strip(), max_length)


def test_longest_first_equals_the_slow_tokenizers_loop():
    """Would catch the fast tokenizer's tie-break (the title cut when both sides are equally long)."""
    for first in range(0, 40):
        for second in range(0, 40):
            for budget in (2, 5, 13, 29, 45):
                a, b = slow_truncate_longest_first(list(range(first)), list(range(second)), max(0, first + second - budget))
                assert longest_first(first, second, budget) == (len(a), len(b)), (first, second, budget)


def test_a_28_token_title_at_32_keeps_15_title_and_14_text_tokens(tokenizer):
    """The issue's case: TASER keeps 15 title + 14 text tokens; a fast tokenizer's pair truncation 14 + 15."""
    title, text = " ".join(["alpha"] * 28), " ".join(["beta"] * 60)
    alpha, beta = tokenizer.convert_tokens_to_ids(["alpha", "beta"])
    ours = passage_ids(tokenizer, [title], [text], 32)[0]
    assert (ours.count(alpha), ours.count(beta)) == (15, 14) and ours == dpr_ids(tokenizer, title, text, 32)
    fast = tokenizer(title, text, truncation="longest_first", max_length=32)["input_ids"]
    assert (fast.count(alpha), fast.count(beta)) == (14, 15)  # what the rule replaced: the test can fail


def test_untruncated_passages_keep_the_ids_of_title_sep_text(tokenizer):
    titles, texts = zip(*PASSAGES)
    ours = passage_ids(tokenizer, titles, texts, 128)
    one_string = tokenizer([passage_string(t, x, tokenizer.sep_token) for t, x in PASSAGES], truncation=True, max_length=128)["input_ids"]
    assert ours == one_string  # the rule before pairs, whenever nothing is truncated
    assert ours == [dpr_ids(tokenizer, t, x, 128) for t, x in PASSAGES]


def test_a_long_title_is_truncated_as_dpr_truncates_it(tokenizer):
    max_length = 48
    title_tokens = len(tokenizer.tokenize(LONG_TITLE))
    assert title_tokens > (max_length - 3) // 2  # long enough for the rules to differ
    ours = passage_ids(tokenizer, [LONG_TITLE], [LONG_TEXT], max_length)[0]
    assert ours == dpr_ids(tokenizer, LONG_TITLE, LONG_TEXT, max_length) and len(ours) == max_length
    first_sep = ours.index(tokenizer.sep_token_id)
    assert 1 < first_sep - 1 < title_tokens  # the title is cut too (longest first), and the text keeps tokens after it
    assert len(ours) - first_sep - 2 > 0 and ours[-1] == tokenizer.sep_token_id
    one_string = tokenizer(passage_string(LONG_TITLE, LONG_TEXT, tokenizer.sep_token), truncation=True, max_length=max_length)["input_ids"]
    assert one_string != ours  # the one-string rule cuts only the end: the text would be lost

    batch = tokenize_passages(tokenizer, [LONG_TITLE, "Hamlet"], [LONG_TEXT, PASSAGES[0][1]], max_length)
    assert set(batch) == {"input_ids", "attention_mask"}  # no token type ids: the encoders use zeros, as DPR passes them
    assert batch["input_ids"][0].tolist() == ours
    short = dpr_ids(tokenizer, *PASSAGES[0], max_length)
    assert batch["input_ids"][1].tolist() == short + [tokenizer.pad_token_id] * (max_length - len(short))
    assert batch["attention_mask"].sum(1).tolist() == [max_length, len(short)]


@pytest.fixture(scope="module")
def dpr_model(tiny_pretrained, tokenizer):
    torch.manual_seed(0)
    model, _ = load_model(tiny_model_cfg(tiny_pretrained, "dpr", max_length=48))
    return model.eval()


def test_passage_vectors_are_those_of_dprs_ids_with_zero_token_types(dpr_model, tokenizer):
    passages = [*PASSAGES, (LONG_TITLE, LONG_TEXT)]
    items = [Passage(str(i), text, title) for i, (title, text) in enumerate(passages)]
    ours = encode_passages(dpr_model, tokenizer, items, batch_size=2, precision="fp32")
    assert np.allclose(encode_texts(dpr_model, tokenizer, passages, "passage", precision="fp32"), ours, atol=1e-6)
    encoder = dpr_model.passage_encoder
    with torch.no_grad():
        for (title, text), vector in zip(passages, ours):
            ids = torch.tensor([dpr_ids(tokenizer, title, text, 48)])
            expected = encoder(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)).last_hidden_state[0, 0]
            torch.testing.assert_close(torch.from_numpy(vector), expected, atol=2e-5, rtol=1e-4)


def test_questions_are_normalised_as_dpr_does(dpr_model, tokenizer):
    curly, straight = "who’s the author of hamlet’s ghost?", "who's the author of hamlet's ghost?"
    assert normalize_question(curly) == straight
    assert tokenizer(curly)["input_ids"] != tokenizer(straight)["input_ids"]  # the tokenizer alone would differ
    assert torch.equal(tokenize_questions(tokenizer, [curly], 32)["input_ids"], tokenize_questions(tokenizer, [straight], 32)["input_ids"])
    # evaluation and validation (encode_questions / encode_texts)
    vectors = encode_questions(dpr_model, tokenizer, [curly, straight], precision="fp32")
    assert np.array_equal(vectors[0], vectors[1])
    assert np.array_equal(encode_texts(dpr_model, tokenizer, [curly], "question", precision="fp32")[0], vectors[1])

    # training (collate) and retrieval for evaluation and mining (dense_retrieve)
    batch = collate([Example(curly, [{"title": "Hamlet", "text": "a play"}]), Example(straight, [{"title": "", "text": "a play"}])], tokenizer, 32, 48)
    assert torch.equal(batch.questions["input_ids"][0], batch.questions["input_ids"][1])

    class Index:  # what dense_retrieve asks of an index: search(vectors, k)
        def search(self, vectors, k):
            return vectors[:, :k], np.array([[str(round(float(v), 6)) for v in row[:k]] for row in vectors])

    assert dense_retrieve(dpr_model, tokenizer, Index(), [curly], 3, precision="fp32") == dense_retrieve(
        dpr_model, tokenizer, Index(), [straight], 3, precision="fp32", progress=False
    )


def test_collate_batches_run_padding_free_as_padded(tokenizer):
    """The training batches of pairs run on the padding-free path (model.unpad) as on the padded one."""

    def encoder(seed):
        torch.manual_seed(seed)
        cfg = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
        return AutoModel.from_config(cfg, attn_implementation="taser_sdpa")

    config = BiEncoderConfig(model_type="taser", pooling="cls", taser={"specialized_layers": [1]})
    ctxs = [{"title": t, "text": x} for t, x in [*PASSAGES, (LONG_TITLE, LONG_TEXT)]]
    examples = [Example("who wrote hamlet?", ctxs[:2]), Example("what is tesla?", [ctxs[4], ctxs[3]])]
    batch = collate(examples, tokenizer, 32, 40)
    assert batch.passages["input_ids"].shape == (4, 40)
    outputs = []
    for unpad in (True, False):
        model = BiEncoder(config, encoder(0), unpad=unpad).eval()
        with torch.no_grad():
            outputs.append(model(batch.questions, batch.passages))
    torch.testing.assert_close(outputs[0].questions, outputs[1].questions, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(outputs[0].passages, outputs[1].passages, atol=2e-5, rtol=1e-4)
