"""The reader's pieces on hand-made inputs: spans and their characters, DPR's loss by hand, EM/F1
normalisation, DPR's checkpoint import against DPR's equations, and bad input."""

import json
import math

import pytest
import torch

from taser.data.errors import DataFormatError
from taser.models.convert.mapping import ConversionError
from taser.reader.data import read_for_reader
from taser.reader.inputs import answer_spans, answer_token_ids, encode_passages, pad_passages
from taser.reader.loss import reader_loss
from taser.reader.metrics import exact_match, f1_score, normalize_answer, score_prediction
from taser.reader.spans import Span, best_span, span_text

QUESTION = "Who won Super Bowl 50?"
TITLE = "Super Bowl 50"
PASSAGE = "The Denver Broncos defeated the Carolina Panthers 24–10 to earn their third Super Bowl title, said Karpukhin in Müller's café."


def _encode(tokenizer, text=PASSAGE, max_length=128):
    return encode_passages(tokenizer, QUESTION, [{"title": TITLE, "text": text}], max_length, 32)[0]


def _token_index(tokenizer, inp, token: str, nth: int = 0) -> int:
    """Index among the passage's tokens of the `nth` token spelled `token`."""
    tokens = tokenizer.convert_ids_to_tokens(inp.passage_ids)
    return [i for i, t in enumerate(tokens) if t == token][nth]


def _logits(inp, start: dict, end: dict, length=None):
    length = length or len(inp.input_ids)
    s, e = torch.full((length,), -5.0), torch.full((length,), -5.0)
    for i, v in start.items():
        s[i] = v
    for i, v in end.items():
        e[i] = v
    return s, e


# -- inputs, spans and characters ------------------------------------------------------------
def test_layout_is_cls_question_sep_title_sep_passage(tokenizer):
    inp = _encode(tokenizer)
    q = tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    t = tokenizer(TITLE, add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert inp.input_ids[: inp.passage_start] == [cls, *q, sep, *t, sep]
    assert inp.passage_ids == tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]
    cut = _encode(tokenizer, max_length=inp.passage_start + 5)
    assert len(cut.input_ids) == inp.passage_start + 5 and len(cut.offsets) == len(cut.word_ids) == 5


def test_best_span_maps_back_to_the_passage_characters(tokenizer):
    inp = _encode(tokenizer)
    first = inp.passage_start
    denver, broncos = _token_index(tokenizer, inp, "denver"), _token_index(tokenizer, inp, "broncos")
    s, e = _logits(inp, {first + denver: 4.0}, {first + broncos: 3.0}, length=len(inp.input_ids) + 7)  # padded logits
    span = best_span(s, e, inp, max_answer_length=10)
    assert (span.start, span.end, span.score) == (denver, broncos, 7.0)
    assert span_text(inp, PASSAGE, span) == ("Denver Broncos", 4, 18)  # the passage's own casing


def test_span_stays_in_the_passage_within_max_length(tokenizer):
    inp = _encode(tokenizer)
    first = inp.passage_start
    the = _token_index(tokenizer, inp, "the")
    title = _token_index(tokenizer, inp, "title")
    # the question and title get the highest logits: never chosen
    s, e = _logits(inp, {1: 50.0, first + the: 3.0}, {first - 2: 50.0, first + title: 3.0, first + the + 2: 1.0})
    span = best_span(s, e, inp, max_answer_length=10)
    assert title - the >= 10 and (span.start, span.end) == (the, the + 2)
    assert best_span(s, e, inp, max_answer_length=title - the + 1).end == title
    # start after end is never a span
    s, e = _logits(inp, {first + 5: 9.0}, {first + 2: 9.0, first + 6: 0.0})
    assert (best_span(s, e, inp, 10).start, best_span(s, e, inp, 10).end) == (5, 6)


def test_subword_spans_widen_to_whole_words_and_unicode(tokenizer):
    inp = _encode(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(inp.passage_ids)
    k = tokens.index("ka")
    assert tokens[k + 1 : k + 4] == ["##rp", "##uk", "##hin"]  # Karpukhin is four word pieces
    assert span_text(inp, PASSAGE, Span(k + 1, k + 2, 0.0))[0] == "Karpukhin"
    mu = tokens.index("muller")  # MiniLM strips accents; the text keeps them
    assert span_text(inp, PASSAGE, Span(mu, mu + 2, 0.0))[0] == "Müller's"
    assert span_text(inp, PASSAGE, Span(len(tokens) - 2, len(tokens) - 2, 0.0))[0] == "café"
    dash = tokens.index("–")
    assert span_text(inp, PASSAGE, Span(dash - 1, dash + 1, 0.0))[0] == "24–10"


def test_answer_spans_are_token_runs_of_the_passage(tokenizer):
    text = "Broncos beat Panthers. Later the broncos beat them again."
    inp = _encode(tokenizer, text)
    spans = answer_spans(inp, answer_token_ids(tokenizer, ["Broncos", "beat Panthers", "Seahawks", ""]), max_answers=10)
    pos = [(s - inp.passage_start, e - inp.passage_start) for s, e in spans]
    assert pos == [(0, 0), (1, 2), (6, 6)]
    assert [span_text(inp, text, Span(s, e, 0))[0] for s, e in pos] == ["Broncos", "beat Panthers", "broncos"]
    assert len(answer_spans(inp, answer_token_ids(tokenizer, ["Broncos", "beat Panthers"]), max_answers=2)) == 2


def test_padding_a_batch(tokenizer):
    a = encode_passages(tokenizer, "q", [{"title": "t", "text": "one two three"}, {"title": "t", "text": "one"}], 64, 8)
    b = encode_passages(tokenizer, "q", [{"title": "t", "text": "x"}], 64, 8)
    ids, mask, present = pad_passages([a, b], 0)
    assert ids.shape == (2, 2, len(a[0].input_ids)) and present.tolist() == [[True, True], [True, False]]
    assert mask[1, 1].tolist() == [1] + [0] * (ids.shape[2] - 1) and mask[0, 1].sum() == len(a[1].input_ids)


# -- the loss ----------------------------------------------------------------------------------
def test_loss_is_dpr_marginal_likelihood_plus_selection_by_hand():
    start = [0.5, 2.0, -1.0, 1.0, 0.0, 9.0]  # the last token is padding: outside every softmax
    end = [0.0, 0.3, 1.5, 2.5, -0.5, 9.0]
    rel = [1.2, 0.4, -0.3, 7.0]  # the last passage is padding
    N, M, L = 1, 4, 6
    start_logits = torch.zeros(N, M, L)
    end_logits = torch.zeros(N, M, L)
    start_logits[0, 0], end_logits[0, 0] = torch.tensor(start), torch.tensor(end)
    start_logits[0, 1:] = end_logits[0, 1:] = 30.0  # negatives' token logits play no part
    mask = torch.ones(N, M, L, dtype=torch.long)
    mask[0, 0, 5] = 0
    present = torch.tensor([[True, True, True, False]])
    starts, ends = torch.tensor([[1, 3, 0]]), torch.tensor([[2, 3, 0]])  # spans (1, 2) and (3, 3); the third is padding
    span_mask = torch.tensor([[True, True, False]])
    total, span, selection, correct = reader_loss(start_logits, end_logits, torch.tensor([rel]), mask, present, starts, ends, span_mask)

    zs, ze = sum(math.exp(x) for x in start[:5]), sum(math.exp(x) for x in end[:5])
    p_s, p_e = [math.exp(x) / zs for x in start[:5]], [math.exp(x) / ze for x in end[:5]]
    want_span = -math.log(p_s[1] * p_e[2] + p_s[3] * p_e[3])  # DPR: -log sum_i P_start(s_i) P_end(e_i)
    want_selection = -math.log(math.exp(rel[0]) / sum(math.exp(x) for x in rel[:3]))
    assert span.item() == pytest.approx(want_span, abs=1e-6)
    assert selection.item() == pytest.approx(want_selection, abs=1e-6)
    assert total.item() == pytest.approx(want_span + want_selection, abs=1e-6)
    assert correct.item() == 1
    # not the product of separately marginalised starts and ends
    separate = -math.log(p_s[1] + p_s[3]) - math.log(p_e[2] + p_e[3])
    assert abs(want_span - separate) > 1e-3
    # one span: the plain start and end cross-entropies; questions are summed
    two = reader_loss(start_logits.repeat(2, 1, 1), end_logits.repeat(2, 1, 1), torch.tensor([rel, rel]), mask.repeat(2, 1, 1),
                      present.repeat(2, 1), torch.tensor([[1], [3]]), torch.tensor([[2], [3]]), torch.tensor([[True], [True]]))
    want = -math.log(p_s[1] * p_e[2]) - math.log(p_s[3] * p_e[3]) + 2 * want_selection
    assert two[0].item() == pytest.approx(want, abs=1e-5)


# -- EM and F1 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("prediction, answer", [
    ("The Denver Broncos", "Denver Broncos"),  # articles
    ("an apple", "apple"), ("A  cat ", "cat"),
    ("Broncos.", "broncos"), ("U.S.A.", "USA"), ("Rock 'n' Roll", "rock n roll"),  # punctuation
    ("New\tYork\n City", "new york city"),  # white space
    ("Café", "Cafe\u0301"),  # composed and decomposed accents (NFD)
    ("the the Beatles", "Beatles"),
])  # fmt: skip
def test_exact_match_normalisation(prediction, answer):
    assert exact_match(prediction, [answer])


@pytest.mark.parametrize("prediction, answer", [
    ("theater", "ater"),  # an article inside a word stays
    ("café", "cafe"),  # an accent is not removed (DPR's and SQuAD's normalisation keep it)
    ("1990–1995", "19901995"),  # a Unicode dash is not ASCII punctuation
    ("Denver", "Denver Broncos"),
])  # fmt: skip
def test_exact_match_misses(prediction, answer):
    assert not exact_match(prediction, [answer])


def test_f1_and_any_answer():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert f1_score("the Denver Broncos team", ["Denver Broncos"]) == pytest.approx(0.8)
    assert f1_score("Panthers", ["Denver Broncos", "Carolina Panthers"]) == pytest.approx(2 / 3)
    assert exact_match("Carolina Panthers", ["Denver Broncos", "the Carolina Panthers"])
    assert score_prediction("nothing", ["Denver"]) == (0.0, 0.0)


def test_regex_answers_as_drqa_matches_them():
    assert score_prediction("Denver Broncos won", [r"Denver\s+Broncos?"], "regex") == (1.0, 1.0)
    assert score_prediction("DENVER broncos", [r"denver broncos"], "regex") == (1.0, 1.0)
    assert score_prediction("in Denver", [r"Denver"], "regex") == (0.0, 0.0)  # anchored at the prediction's start
    with pytest.warns(UserWarning, match="does not compile"):
        assert score_prediction("x", [r"(unclosed"], "regex") == (0.0, 0.0)


# -- bad input -----------------------------------------------------------------------------------
def _record(i, n=3, **extra):
    return {"question": f"q{i}", "answers": ["a"], "ctxs": [{"id": str(j), "title": "t", "text": "a b", "score": 1.0, "has_answer": True}
                                                           for j in range(n)], **extra}


def test_bad_retrieval_json_names_file_record_and_problem(tmp_path):
    path = tmp_path / "r.json"
    cases = [
        ([_record(0), {"question": "q1", "answers": ["a"]}], "record 1: missing field(s) ['ctxs']"),
        ([_record(0), {"question": "q1", "ctxs": []}], "record 1: missing field(s) ['answers']"),
        ([_record(0), {**_record(1), "answers": []}], "record 1 ('q1'): 'answers' must be a non-empty list"),
        ([_record(0), _record(1, n=0)], "record 1 ('q1'): 'ctxs' is empty"),
        ([_record(0), _record(1, n=2)], "record 1 ('q1'): 2 passages retrieved, fewer than k=3"),
        ([{**_record(0), "ctxs": [{"id": "1", "title": "t"}] * 3}], "record 0, ctx 0: no 'text' string"),
    ]
    for records, message in cases:
        path.write_text(json.dumps(records))
        with pytest.raises(DataFormatError) as err:
            read_for_reader(path, k=3)
        assert str(err.value) == f"{path}, {message}" or str(err.value).startswith(f"{path}, {message}"), str(err.value)
    path.write_text(json.dumps([_record(0)]))
    assert len(read_for_reader(path, k=3)) == 1


# -- DPR's reader checkpoint ---------------------------------------------------------------------
def _dpr_file(tmp_path, tiny_pretrained, drop=None):
    from transformers import BertModel

    bert = BertModel.from_pretrained(tiny_pretrained)  # with its pooler, as DPR's HFBertEncoder
    torch.manual_seed(1)
    hidden = bert.config.hidden_size
    state = {f"encoder.{k}": v for k, v in bert.state_dict().items()}
    state.update({"qa_outputs.weight": torch.randn(2, hidden), "qa_outputs.bias": torch.randn(2),
                  "qa_classifier.weight": torch.randn(1, hidden), "qa_classifier.bias": torch.randn(1)})
    state.pop(drop, None)
    path = tmp_path / "reader.cp"
    torch.save({"model_dict": state, "encoder_params": {"pretrained_model_cfg": tiny_pretrained, "sequence_length": 64}}, path)
    return path, bert.eval(), state


def test_dpr_reader_checkpoint_scores_as_dprs_equations(tmp_path, tiny_pretrained, tokenizer):
    from taser.reader.convert import import_dpr_reader
    from taser.reader.model import load_reader

    path, bert, state = _dpr_file(tmp_path, tiny_pretrained)
    import_dpr_reader(path, tmp_path / "imported")
    reader, tok = load_reader(tmp_path / "imported")
    assert reader.config.max_length == 64 and len(tok) == len(tokenizer)
    reader.eval()
    inputs = encode_passages(tok, QUESTION, [{"title": TITLE, "text": PASSAGE}, {"title": "Other", "text": "Nothing here."}], 64, 16)
    ids, mask, _ = pad_passages([inputs], tok.pad_token_id)
    with torch.no_grad():
        out = reader(ids, mask)
        # DPR's Reader._forward: BERT with zero token types, qa_outputs on every token, qa_classifier on [CLS]
        seq = bert(ids[0], attention_mask=mask[0], token_type_ids=torch.zeros_like(ids[0]))[0]
        logits = seq @ state["qa_outputs.weight"].T + state["qa_outputs.bias"]
        rank = seq[:, 0, :] @ state["qa_classifier.weight"].T + state["qa_classifier.bias"]
    torch.testing.assert_close(out.start_logits[0], logits[..., 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.end_logits[0], logits[..., 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.relevance_logits[0], rank[:, 0], rtol=1e-5, atol=1e-5)

    (tmp_path / "bad").mkdir()
    bad, _, _ = _dpr_file(tmp_path / "bad", tiny_pretrained, drop="qa_classifier.bias")
    with pytest.raises(ConversionError, match="1 missing: qa_classifier.bias"):
        import_dpr_reader(bad, tmp_path / "bad-out")
    with pytest.raises(ConversionError, match="exists"):
        import_dpr_reader(path, tmp_path / "imported")


def test_dpr_reader_import_through_convert_checkpoint(tmp_path, tiny_pretrained):
    """`scripts/convert_checkpoint.py conversion=import_dpr_reader` writes the reader the direct import writes."""
    from safetensors.torch import load_file

    from taser.pipeline.convert import convert_checkpoint
    from taser.reader.convert import import_dpr_reader

    path, _, _ = _dpr_file(tmp_path, tiny_pretrained)
    import_dpr_reader(path, tmp_path / "direct")
    out = convert_checkpoint("import_dpr_reader", path, tmp_path / "converted", max_length=48)
    direct, converted = load_file(tmp_path / "direct" / "model.safetensors"), load_file(out / "model.safetensors")
    assert direct.keys() == converted.keys() and all(torch.equal(direct[k], converted[k]) for k in direct)
    assert json.loads((out / "config.json").read_text())["taser_reader"]["max_length"] == 48
    with pytest.raises(ValueError, match="ctx_source"):
        convert_checkpoint("import_dpr_reader", path, tmp_path / "x", ctx_source=str(path))


def test_the_reader_trains_in_float32_from_a_half_precision_checkpoint(tiny_pretrained, tmp_path):
    """Would catch a bf16-saved encoder (or reader) loaded as bf16 weights: AdamW's small updates to
    them round away (the bi-encoder loads float32 whatever the file's dtype; so must the reader)."""
    from transformers import AutoModel

    from taser.reader.model import Reader

    AutoModel.from_pretrained(tiny_pretrained).to(torch.bfloat16).save_pretrained(tmp_path / "bf16-bert")
    fresh = Reader.from_pretrained(str(tmp_path / "bf16-bert"), 64, 16)
    assert {p.dtype for p in fresh.parameters()} == {torch.float32}
    fresh.to(torch.bfloat16).save(tmp_path / "bf16-reader")
    loaded = Reader.load(tmp_path / "bf16-reader")
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
