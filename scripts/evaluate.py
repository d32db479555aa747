"""Retrieve top-k passages for a QA file and report top-1/5/20/100 accuracy.

`python scripts/evaluate.py checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index`
`python scripts/evaluate.py retriever=bm25 bm25.backend=pyserini`
`python scripts/evaluate.py retriever=hybrid checkpoint=... index=... hybrid.lambda=1.1`
"""

import hydra

from taser.cli import CONFIG_DIR, plain, setup_logging
from taser.pipeline.evaluate import evaluate_bm25, evaluate_dense, evaluate_hybrid

RETRIEVERS = ("dense", "bm25", "hybrid")


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    c = plain(cfg)
    retriever = c["retriever"]
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever={retriever!r} is not available; use one of {', '.join(RETRIEVERS)}")
    if retriever != "bm25" and (not c["checkpoint"] or not c["index"]):
        raise ValueError(f"retriever={retriever} needs checkpoint=... and index=...")
    common = dict(qa_file=c["qa_file"], passages_tsv=c["passages"], out_dir=c["out_dir"], k=c["k"], match=c["match"])
    dense = dict(checkpoint=c["checkpoint"], index_dir=c["index"], batch_size=c["batch_size"], precision=c["precision"], device=c["device"])
    if retriever == "dense":
        results = evaluate_dense(**dense, **common)
    elif retriever == "bm25":
        results = evaluate_bm25(**common, bm25=c["bm25"])
    else:
        h = c["hybrid"]
        results = evaluate_hybrid(**dense, **common, bm25=c["bm25"], lam=h["lambda"], rule=h["rule"], candidates=h["candidates"])
    print(results["summary"])


if __name__ == "__main__":
    main()
