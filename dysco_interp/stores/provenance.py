"""Where and when a record was made, and by what command: kept in each record of a store, beside
the settings (which a store compares) and never among them, so a run resumed on another machine
still joins its store while each record says where it came from."""

from __future__ import annotations

import datetime
import os
import platform

import torch


def machine_name(device: torch.device) -> str:
    """The accelerator's name ("NVIDIA H100 80GB HBM3"), or the CPU's architecture and core count."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine() or 'unknown'}, {os.cpu_count() or 0} cores)"


def provenance(device: torch.device, command: str | None = None) -> dict:
    """{machine, started (UTC, to the second), command (None when not run from a command line)}."""
    started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return {"machine": machine_name(device), "started": started, "command": command}


__all__ = ["machine_name", "provenance"]
