"""The Ray cluster a run uses: a quiet local one by default, or an existing one by address.

- Local (the default): a new local cluster of this run's own (`ray.init(address="local")`),
  beside any cluster already running on the machine (`ray start --head`, or the session file
  one left behind, which plain `ray.init` would try to join): one line says so. The
  dashboard is off, the object store small and bounded, logs kept out of the terminal, as
  many CPUs as the plan has slots.
- `--address ADDR` or `RAY_ADDRESS`: join an existing cluster. An unreachable address is a
  clear error within seconds (Ray itself would retry for minutes); a refused token (Ray's
  token authentication, `RAY_AUTH_MODE=token`) or a Ray/Python version mismatch is one line
  naming the cause, with Ray's own retry warnings kept off the terminal.
- One placement group per plan group, one bundle per replica (rlgraph.process.replicas): on a local
  CPU cluster its share of the group's slots; on GPUs one GPU (a replica per GPU).
  A plan that needs GPUs the cluster lacks is refused before any actor starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from rlgraph.compiler.plan import GroupPlan, Plan
from rlgraph.errors import MissingDependencyError, RLGraphError

OBJECT_STORE_MB = 128  # bounded: batches and weight buckets of the tiny model are a few MB
WEIGHT_COPIES_IN_STORE = 3  # a version being sent, one being read, one spare
RESERVE_TIMEOUT_S = 60.0


class ClusterError(RLGraphError):
    """The Ray cluster cannot be reached or cannot hold the plan."""


def _probe(address: str, timeout: float = 5.0) -> None:
    """Refuse an unreachable `host:port` quickly instead of letting Ray retry for minutes."""
    if address == "auto":
        return  # Ray answers at once when no local cluster runs
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--address '{address}' is not host:port (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ClusterError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} "
            "(start one with `ray start --head`, or drop --address / RAY_ADDRESS to run locally)"
        ) from None


def object_store_mb(weight_bytes: float) -> int:
    """Local object store size: OBJECT_STORE_MB, or room for a few copies of the weights."""
    return max(OBJECT_STORE_MB, int(WEIGHT_COPIES_IN_STORE * weight_bytes / 2**20) + 64)


def connect(plan: Plan, address: str | None = None,
            object_store_mb: int = OBJECT_STORE_MB) -> bool:
    """Start or join Ray for `plan`; returns True when this call started it (and owns it)."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("rlgraph run needs Ray: pip install 'ray>=2.40'") from None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _probe(address)
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False,
             "configure_logging": True}
    # a local run needs no advice on cluster auth settings: keep the terminal for the run
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR)
    with _keep_sigterm():
        if address:
            _join(address, quiet)
            return True
        note = existing_cluster_note()
        if note:
            print(f"rlgraph: {note}", file=sys.stderr, flush=True)
        local = plan.placement.local
        slots = plan.placement.slots if local else 0
        ray.init(address="local", num_cpus=max(slots, 1) if local else None,
                 num_gpus=0 if local else visible_gpus(), include_dashboard=False,
                 object_store_memory=object_store_mb * 2**20, **quiet)
    return True


@contextlib.contextmanager
def _keep_sigterm() -> Any:
    """`ray.init` replaces the SIGTERM handler with a bare exit: keep the run's own (which
    stops with a checkpoint)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def existing_cluster_note() -> str | None:
    """One line when a cluster started with `ray start` (or its stale session file) is
    there, which this run leaves alone; None otherwise."""
    try:
        from ray._private.utils import read_ray_address

        found = read_ray_address()
    except (ImportError, OSError):
        return None
    if not found:
        return None
    try:
        _probe(found, timeout=1.0)
    except ClusterError:
        return (f"ignoring a stale Ray session file (nothing answers at {found}); starting a "
                f"local Ray cluster for this run")
    return (f"a Ray cluster runs at {found}; this run starts its own local cluster beside it "
            f"(to run on that one instead: --address {found})")


def _join(address: str, quiet: dict[str, Any]) -> None:
    """`ray.init(address)` with Ray's retry warnings captured, a failure named in one line."""
    import ray

    with tempfile.TemporaryFile(mode="w+b") as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)  # the C++ core's warnings go to fd 2 directly
        try:
            ray.init(address=address, **quiet)
            error: BaseException | None = None
        except Exception as exc:
            error = exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if error is None:
            return
        captured.seek(0)
        log = captured.read().decode(errors="replace")
    raise ClusterError(join_failure(address, error, log, os.environ)) from None


def join_failure(address: str, error: BaseException, log: str,
                 env: Any = os.environ) -> str:
    """The one-line cause of a failed join, from Ray's exception and its captured output."""
    text = f"{type(error).__name__}: {error}\n{log}"
    head = f"cannot join the Ray cluster at {address}"
    token_mode = str(env.get("RAY_AUTH_MODE", "")).lower() == "token"
    if type(error).__name__ == "AuthenticationError" or "no authentication token" in text:
        return (f"{head}: RAY_AUTH_MODE=token but no token found here; give the cluster's "
                f"token in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, or in "
                f"~/.ray/auth_token (`ray get-auth-token` on the head prints it)")
    if "Unauthenticated" in text or "InvalidAuthToken" in text:
        if not token_mode:
            return (f"{head}: the cluster requires token authentication; set "
                    f"RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, "
                    f"RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
        source = ("RAY_AUTH_TOKEN" if env.get("RAY_AUTH_TOKEN") else
                  env.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token")
        return (f"{head}: the cluster refused the token from {source}; use the token the "
                f"cluster was started with (`ray get-auth-token` on the head prints it)")
    if "Version mismatch" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("Ray:",
                                                                                  "Python:"))]
        versions = ", ".join(lines[:2]) + " there; " + ", ".join(lines[2:4]) + " here"
        return (f"{head}: version mismatch ({versions}); install the cluster's Ray and Python "
                f"versions on this machine")
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (f"{head}: {first} (is it a Ray head's GCS port, e.g. 6379? drop --address / "
            f"RAY_ADDRESS to run on a local cluster)")


def visible_gpus() -> int | None:
    """GPUs this machine shows torch (CUDA_VISIBLE_DEVICES respected), for a local Ray
    cluster that runs a GPU plan; None lets Ray detect them itself."""
    try:
        import torch
    except ImportError:
        return None
    count = torch.cuda.device_count()
    return count or None


@dataclass
class GroupReservation:
    """A plan group's placement group and what each of its replicas' actors asks for."""

    group: str
    placement_group: Any
    bundle: dict[str, float]
    slots: int  # CPU threads (local) or GPUs one replica drives
    replicas: int = 1


@dataclass
class Reservations:
    """Placement groups of every plan group; `release` gives them back."""

    groups: dict[str, GroupReservation] = field(default_factory=dict)

    def actor_options(self, group: str, rank: int = 0) -> dict[str, Any]:
        """`.options(...)` for replica `rank` of `group`: its bundle, its CPUs/GPUs."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        res = self.groups[group]
        return {
            "num_cpus": res.bundle.get("CPU", 0),
            "num_gpus": res.bundle.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=res.placement_group, placement_group_bundle_index=rank),
        }

    def release(self) -> None:
        """Remove every placement group (actors in them must be gone first)."""
        from ray.util.placement_group import remove_placement_group

        for res in self.groups.values():
            with contextlib.suppress(Exception):  # best effort at teardown
                remove_placement_group(res.placement_group)
        self.groups.clear()


def group_bundles(group: GroupPlan, local: bool) -> list[dict[str, float]]:
    """Bundles of a plan group, one per replica: its share of the CPU slots locally, else one
    GPU (and a CPU for its process)."""
    count = len(group.devices) or group.gpus or 1
    replicas = group.replicas or 1
    if local:
        return [{"CPU": float(max(1, count // replicas))}] * replicas
    return [{"GPU": 1.0, "CPU": 1.0}] * count


def reserve(plan: Plan, timeout_s: float = RESERVE_TIMEOUT_S) -> Reservations:
    """One placement group per plan group; refuses a plan the cluster cannot hold."""
    import ray
    from ray.util.placement_group import placement_group

    placement = plan.placement
    local = placement.local
    wanted = {g.name: group_bundles(g, local) for g in placement.groups}
    have = ray.cluster_resources()
    for resource in ("GPU", "CPU"):
        need = sum(b.get(resource, 0) for bundles in wanted.values() for b in bundles)
        if need > have.get(resource, 0):
            what = f"{placement.gpu or 'GPU'} GPUs" if resource == "GPU" else "CPUs"
            hint = ("run on a GPU cluster with --address, or set cluster: {local: true} to run "
                    "on CPU") if resource == "GPU" else "lower cluster.cpus or the group shares"
            raise ClusterError(f"the plan needs {need:g} {what}; the Ray cluster has "
                               f"{have.get(resource, 0):g} ({hint})")
    out = Reservations()
    for name, bundles in wanted.items():
        strategy = "STRICT_PACK" if local or len(bundles) == 1 else "PACK"
        pg = placement_group(bundles, strategy=strategy, name=f"rlgraph-{name}")
        if not pg.wait(timeout_seconds=timeout_s):
            out.groups[name] = GroupReservation(name, pg, bundles[0], 0)
            out.release()
            raise ClusterError(f"could not reserve {bundles} for group '{name}' within "
                               f"{timeout_s:.0f}s (the cluster is busy or too small)")
        slots = int(bundles[0].get("GPU", 0) or bundles[0].get("CPU", 0))
        out.groups[name] = GroupReservation(name, pg, bundles[0], slots, len(bundles))
    return out


def shutdown(owned: bool) -> None:
    """Stop Ray if this run started it."""
    if owned:
        import ray

        ray.shutdown()
