"""Retrieve top-k passages for a QA file and report top-1/5/20/100 accuracy.

`python scripts/evaluate.py checkpoint=outputs/train/dpr/final index=outputs/train/dpr/index`
`python scripts/evaluate.py retriever=bm25 bm25.backend=pyserini`
`python scripts/evaluate.py retriever=hybrid checkpoint=... index=... hybrid.dense_weight=1.1`
"""

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed
from taser.pipeline.evaluate import evaluate_bm25, evaluate_dense, evaluate_hybrid


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    common = dict(qa_file=job.qa_file, passages_tsv=job.passages, out_dir=job.out_dir, k=job.k, match=job.match)
    dense = dict(checkpoint=job.checkpoint, index_dir=job.index, batch_size=job.batch_size, precision=job.precision, device=job.device)
    if job.retriever == "dense":
        results = evaluate_dense(**dense, **common)
    elif job.retriever == "bm25":
        results = evaluate_bm25(**common, bm25=job.bm25)
    else:
        h = job.hybrid
        results = evaluate_hybrid(**dense, **common, bm25=job.bm25, lam=h.dense_weight, rule=h.rule, candidates=h.candidates)
    print(results["summary"])


if __name__ == "__main__":
    main()
