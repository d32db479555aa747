"""Token ids as DPR's and TASER's `text_to_tensor` builds them with transformers 4.x's slow
`BertTokenizer` (their pinned stack), written from that code, not with this library's tokenisation:
`tokenizer.encode(title, text_pair=text, truncation=True, max_length=...)`, whose longest-first
truncation is the loop below."""

from __future__ import annotations


def slow_truncate_longest_first(ids: list[int], pair_ids: list[int], num_tokens_to_remove: int) -> tuple[list[int], list[int]]:
    """transformers 4.x's `PreTrainedTokenizerBase.truncate_sequences` with `longest_first`: one token
    at a time from the first sequence while it is strictly longer, else from the second."""
    for _ in range(num_tokens_to_remove):
        if pair_ids is None or len(ids) > len(pair_ids):
            ids = ids[:-1]
        else:
            pair_ids = pair_ids[:-1]
    return ids, pair_ids


def dpr_ids(tokenizer, title: str, text: str, max_length: int) -> list[int]:
    """DPR's ids of a passage (before padding): each side tokenised alone, the pair truncated by the
    slow tokenizer's loop, then `[CLS] title [SEP] text [SEP]`; an untitled text alone."""
    if title:
        first = tokenizer(title, add_special_tokens=False)["input_ids"]
        second = tokenizer(text, add_special_tokens=False)["input_ids"]
        first, second = slow_truncate_longest_first(first, second, max(0, len(first) + len(second) + 3 - max_length))
        return [tokenizer.cls_token_id] + first + [tokenizer.sep_token_id] + second + [tokenizer.sep_token_id]
    return tokenizer.encode(text, truncation=True, max_length=max_length)
