"""Loggers of our own, where Lightning's need a change."""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger

log = logging.getLogger(__name__)


def wandb_has_credentials() -> bool:
    """An API key in the environment or from `wandb login` (~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        hosts = netrc.netrc().hosts
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return any("wandb" in host for host in hosts)


class WandbLogger(_LightningWandbLogger):
    """Weights & Biases that never waits for a login: without credentials (or with
    `WANDB_MODE=offline`) it logs offline, says so once, and names the `wandb sync` command that
    uploads the run later. Jobs of one sweep share a group (the sweep's folder name)."""

    def __init__(self, offline: bool | None = None, **kwargs: Any) -> None:
        if offline is None:
            offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_has_credentials()
        if not kwargs.get("group"):
            kwargs["group"] = os.environ.get("LITFORGE_SWEEP") or None
        super().__init__(offline=offline, **kwargs)
        if offline:
            save_dir = kwargs.get("save_dir") or "."
            log.info(
                "wandb: no API key, logging offline into %s/wandb; upload later with "
                "`wandb sync %s/wandb/offline-run-*`",
                save_dir,
                save_dir,
            )
