"""Checkpoints in other projects' layouts, in and out of this library's checkpoint directory.

In (to a checkpoint directory `load_checkpoint` reads):
- `hf_dpr`: a pair of Hugging Face DPR encoders (`DPRQuestionEncoder`, `DPRContextEncoder`
  directories) -> a `dpr` model;
- `dpr_original`: DPR's own `.cp` training checkpoint (`model_dict` with `question_model.*` and
  `ctx_model.*`) -> a `dpr` model;
- `taser_release`: TASER's released `pytorch_model.bin` (microsoft/taser, `moe_type: mod3:fwd`,
  two experts, one shared encoder) -> a `taser` model.

Out: `dpr` -> the Hugging Face DPR pair (`hf_dpr`); `shared` / `dpr` -> a sentence-transformers
directory (`sentence_transformers_dir`); `taser` -> TASER's layout (`taser_release`), the flat
`encoder_params` and `encoder_model_type: hf_any` that TASER's own scripts load.

Every conversion maps tensors by name (`mapping.gather`): each tensor of the model is found, with
its shape, and each tensor of the file is used, or the conversion stops naming the file and the
missing, unexpected or misshapen tensors. Nothing is written until the mapping is complete, and
outputs are written to a temporary directory renamed when whole.
"""
