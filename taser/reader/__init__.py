"""DPR's extractive reader (Karpukhin et al. 2020, Section 6) on any BERT-family encoder: from a
retriever's ranked passages to answers, with exact match and F1.

- `model`: the reader (`[CLS] question [SEP] title [SEP] passage` -> start/end and selection logits);
- `inputs`, `spans`: token ids and answer spans, and back from tokens to the passage's characters;
- `loss`, `batches`, `trainer`: DPR's objective, its batches, the training loop;
- `reading`, `metrics`: inference over the top k passages, EM / F1;
- `data`: retrieval JSON checked for reading and training; `convert`: DPR's reader checkpoint;
- `config`: the scripts' schemas. The two stages (train, read) are `taser.pipeline.reader`, beside the retriever's stages.
"""
