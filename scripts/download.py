"""Fetch DPR's and TASER's data and checkpoints (resumed, checksum-verified) into data_dir; see configs/download.yaml."""

import hydra

from taser.cli import CONFIG_DIR, setup_logging, typed


@hydra.main(config_path=CONFIG_DIR, config_name="download", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    job = typed(cfg)
    from taser.data.resources import RESOURCES
    from taser.pipeline.download import fetch

    if job.list_resources:
        for name, res in RESOURCES.items():
            print(f"{name}\t{res.path(job.data_dir)}\t{res.desc}")
        return
    names = job.names()
    if not names:
        print(f"table {job.table['name']} names no resources to fetch (its data ships with the project)")
    for name in names:
        print(fetch(name, job.data_dir, job.progress))


if __name__ == "__main__":
    main()
