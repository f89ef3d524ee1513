"""`logger=wandb`: Lightning's WandbLogger, offline without credentials, resumable."""

import logging
import netrc
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger

from litforge.hooks import LogsRunFiles

log = logging.getLogger(__name__)


def wandb_has_credentials() -> bool:
    """An API key in the environment or from `wandb login` (~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return any("wandb" in host for host in netrc.netrc().hosts)
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger(LogsRunFiles, _LightningWandbLogger):
    """Never waits for a login: offline without credentials (or `WANDB_MODE=offline`), naming the
    `wandb sync` command. A resumed run (`resume_from`) goes on in its folder's newest wandb run.
    The run's pictures, if it drew any (`plots/*.png`), are sent as images at its end."""

    def __init__(
        self, offline: bool | None = None, resume_from: str | None = None, **kwargs: Any
    ) -> None:
        if offline is None:
            offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_has_credentials()
        save_dir = kwargs.get("save_dir") or "."
        if resume_from and not kwargs.get("id"):  # wandb's folders: `[offline-]run-<time>-<id>`
            runs = sorted(
                Path(save_dir, "wandb").glob("*run-*-*"), key=lambda p: p.name.split("run-", 1)[1]
            )
            if runs:
                kwargs |= {"id": runs[-1].name.rsplit("-", 1)[1], "resume": "allow"}
        super().__init__(offline=offline, **kwargs)
        if offline:
            log.info(
                f"wandb: no API key, logging offline into {save_dir}/wandb; upload later with "
                f"`wandb sync {save_dir}/wandb/offline-run-*`"
            )

    def log_run_files(self, run_dir: Path, best_checkpoint: str | None) -> None:
        for picture in sorted(Path(run_dir, "plots").glob("*.png")):
            self.log_image(key=picture.stem, images=[str(picture)])
