"""Hugging Face hub ids in `model.path` (`Qwen/Qwen2.5-0.5B-Instruct`), resolved to a local
snapshot folder through `huggingface_hub`: its cache (HF_HOME / HF_HUB_CACHE) first, a
download only when the id is not cached and the hub is reachable (HF_HUB_OFFLINE unset).

The rest of rlgraph only ever sees the local folder, so compile, run, warm start and export
read the same files; a resumed run resolves the id to the same snapshot while the cache
keeps it. Imports neither torch nor ray (the compiler calls it).
"""

from __future__ import annotations

import re

from rlgraph.errors import MissingDependencyError, SpecError

# owner/name as the hub spells repository ids (no leading '.', '/' or '~': those are paths)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
KEY = ("model", "path")


def looks_like_hub_id(path: str) -> bool:
    """Whether `path` has the form of a hub repository id (owner/name)."""
    return bool(HUB_ID.match(path)) and ".." not in path


def resolve_hub_id(repo_id: str) -> str:
    """The local snapshot folder of hub model `repo_id`: the cached one, else downloaded
    (config, tokenizer and safetensors weights); a SpecError when offline and not cached."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise MissingDependencyError(f"model.path '{repo_id}' is a hub id, which needs "
                                     "huggingface_hub: pip install huggingface_hub") from None
    cache = constants.HF_HUB_CACHE
    try:
        return snapshot_download(repo_id, cache_dir=cache, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise SpecError(f"'{repo_id}' is not a local folder, and the Hugging Face cache "
                        f"{cache} has no snapshot of it (HF_HUB_OFFLINE is set)", KEY,
                        hint=f"run `hf download {repo_id}` where the hub is reachable, or "
                        "point HF_HOME / HF_HUB_CACHE at a cache that holds it") from None
    try:
        return snapshot_download(repo_id, cache_dir=cache, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.py"])
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise SpecError(f"cannot fetch '{repo_id}' from the Hugging Face hub: {exc}", KEY,
                        hint="check the id and your network, set HF_TOKEN for a gated "
                        "model, or give a local folder") from None
