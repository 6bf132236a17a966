"""One Hugging Face repository's config.json, and nothing else, through huggingface_hub.

`hf:owner/name[@revision]` asks the hub with `hf_hub_download(repo_id, "config.json", revision=…)`, so its
cache (HF_HUB_CACHE / HF_HOME), HF_HUB_OFFLINE=1 and HF_TOKEN (gated repositories) work as everywhere
else in the Hugging Face stack. Weights are never asked for. Online, a HEAD request first reads the
file's size and commit without retries, so that an unreachable hub fails in seconds (hf_hub_download
alone retries a timed-out HEAD with a 60 s timeout) and an oversized file is refused before a byte of it
is downloaded; hf_hub_download then fetches it (or finds that commit in the cache) and records the
branch's commit under refs/, so that a later offline run finds it.

A failure is either final (`ModelRefError`: an oversized file) or `HubUnavailable` (offline and not
cached, the network down, gated without a token, no such repository, revision or file): hf.py then falls
back to the bundled table when it holds the name, says so, and otherwise reports the reason on one line.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from trainmem.errors import ModelRefError

CONFIG_FILE = "config.json"
# A config.json's architecture fields take under 1 KB (the bundled table's copies: 0.4–0.7 KB); label
# tables make the large ones: an ImageNet classifier lists its 1,000 classes twice (id2label, label2id),
# about 70 KB, and ImageNet-22k's 21,841 make about 1.5 MB. 4 MiB keeps every such file and bounds what is
# downloaded, read and parsed (measured: json.loads of a 4.8 MiB label table, 0.15 s and 17 MiB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# Seconds the HEAD request may wait for the hub: huggingface_hub's own default (DEFAULT_ETAG_TIMEOUT),
# without its retries; HF_HUB_ETAG_TIMEOUT overrides it as it does for hf_hub_download.
HUB_TIMEOUT_S = 10
# The hub's repository ids (huggingface_hub.utils.validate_repo_id): owner/name, each 1–96 of letters,
# digits, '-', '_', '.', not starting or ending with '-' or '.', and never '--' or '..'.
_NAME_PART = r"[A-Za-z0-9_](?:[\w.\-]{0,94}[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_NAME_PART}/{_NAME_PART}")
# A revision is a branch, a tag or a commit (refs/pr/1 included). The cache stores a branch's commit in a
# file under refs/<revision>, so '..' or a leading '/' would name a path outside the cache: refused.
REVISION = re.compile(r"[A-Za-z0-9_][\w.\-/]{0,127}")


class HubUnavailable(Exception):
    """The hub could not answer (offline, unreachable, gated, unknown): a bundled copy may stand in."""


@dataclasses.dataclass(frozen=True)
class HubConfig:
    """Where a config.json came from: the snapshot file in the hub's cache and the commit it belongs to."""

    repo_id: str
    revision: str  # as asked: a branch, a tag or a commit ("main" when none was given)
    commit: str | None  # the snapshot's commit hash
    path: Path
    downloaded: bool  # False: the cache already held it

    def describe(self) -> str:
        commit = f", commit {self.commit[:12]}" if self.commit and self.commit != self.revision else ""
        how = "downloaded from the hub" if self.downloaded else "from the hub cache"
        return f"config.json {how} ({self.repo_id}, revision {self.revision}{commit})"

    def to_dict(self) -> dict[str, str | None]:
        return {"from": "hub" if self.downloaded else "hub-cache", "repo": self.repo_id, "revision": self.revision,
                "commit": self.commit, "path": str(self.path)}


def parse_repo_ref(text: str) -> tuple[str, str | None] | None:
    """`owner/name` or `owner/name@revision` → (repo id, revision or None); None when `text` is not one."""
    repo_id, at, revision = text.partition("@")
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        return None
    if at and not (REVISION.fullmatch(revision) and ".." not in revision and "//" not in revision
                   and not revision.endswith("/")):
        raise ModelRefError(f"expected a revision after @ (a branch, tag or commit such as main or v1.0), "
                            f"got {clip_text(revision)!r}", where="MODEL")
    return repo_id, (revision if at else None)


_FETCHED: dict[tuple, HubConfig] = {}  # one HEAD per repository and revision per process (fit asks many times)


def fetch_config(repo_id: str, revision: str | None) -> HubConfig:
    """The repository's config.json in the hub's cache, downloaded if needed (see the module's docstring)."""
    hub = _hub()
    revision = revision or "main"
    offline = _offline(hub)
    key = (repo_id, revision, str(hub.constants.HF_HUB_CACHE), offline)
    if key not in _FETCHED:
        _FETCHED[key] = _fetch(hub, repo_id, revision, offline)
    return _FETCHED[key]


def _fetch(hub, repo_id: str, revision: str, offline: bool) -> HubConfig:
    errors = _errors(hub)
    name = f"{repo_id}@{revision}"
    commit = None
    if not offline:
        try:
            metadata = hub.get_hf_file_metadata(hub.hf_hub_url(repo_id, CONFIG_FILE, revision=revision),
                                                timeout=_timeout(hub))
        except errors.GatedRepoError:
            raise HubUnavailable(f"{repo_id} is gated: accept its terms on https://huggingface.co/{repo_id} and "
                                 "set HF_TOKEN to a token that has access") from None
        except errors.RepositoryNotFoundError:
            raise HubUnavailable(f"no repository {repo_id} on the hub (or it is private: set HF_TOKEN)") from None
        except errors.RevisionNotFoundError:
            raise HubUnavailable(f"no revision {revision!r} in {repo_id}") from None
        except errors.EntryNotFoundError:
            raise HubUnavailable(f"{repo_id} has no config.json at {revision} (not a transformers model?)") from None
        except Exception as error:  # noqa: BLE001 - the network down, a proxy, a timeout: try the cache
            reason = f"the hub could not be reached ({clip_text(type(error).__name__ + ': ' + str(error), 120)})"
            cached = _cached(hub, repo_id, revision)
            if cached is None:
                raise HubUnavailable(f"{reason} and {name}'s config.json is not in the hub cache") from None
            return _checked(HubConfig(repo_id, revision, _commit_of(cached), cached, downloaded=False))
        if metadata.size is not None and metadata.size > MAX_CONFIG_BYTES:
            raise ModelRefError(f"expected a config.json of at most {MAX_CONFIG_BYTES:,} bytes, got one of "
                                f"{metadata.size:,} bytes", where=f"hf:{name}")
        commit = metadata.commit_hash
    was_cached = _cached(hub, repo_id, commit or revision) is not None
    try:
        # the revision as asked (not the commit): hf_hub_download records a branch's commit under refs/,
        # so that an offline run later finds it in the cache
        path = Path(hub.hf_hub_download(repo_id, CONFIG_FILE, revision=revision, etag_timeout=_timeout(hub)))
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        raise HubUnavailable(f"HF_HUB_OFFLINE is set and {name}'s config.json is not in the hub cache "
                             f"({hub.constants.HF_HUB_CACHE}); unset HF_HUB_OFFLINE to download it, or "
                             "give a local config.json") from None
    except errors.GatedRepoError:
        raise HubUnavailable(f"{repo_id} is gated: set HF_TOKEN to a token that has access") from None
    except errors.RepositoryNotFoundError:
        raise HubUnavailable(f"no repository {repo_id} on the hub (or it is private: set HF_TOKEN)") from None
    except Exception as error:  # noqa: BLE001 - a download cut short: one line, not the library's traceback
        raise HubUnavailable(f"the download of {name}'s config.json failed "
                             f"({clip_text(type(error).__name__ + ': ' + str(error), 120)})") from None
    return _checked(HubConfig(repo_id, revision, _commit_of(path) or commit, path, downloaded=not was_cached))


def _checked(found: HubConfig) -> HubConfig:
    """The cache is a directory anyone may have written into: its file is bounded like a download."""
    try:
        size = found.path.stat().st_size
    except OSError as error:
        raise ModelRefError(f"expected a readable config.json in the hub cache, got {error.strerror}",
                            where=str(found.path)) from None
    if size > MAX_CONFIG_BYTES:
        raise ModelRefError(f"expected a config.json of at most {MAX_CONFIG_BYTES:,} bytes, got one of {size:,} "
                            "bytes", where=str(found.path))
    return found


def _cached(hub, repo_id: str, revision: str) -> Path | None:
    found = hub.try_to_load_from_cache(repo_id, CONFIG_FILE, revision=revision)
    return Path(found) if isinstance(found, str) else None


def _commit_of(path: Path) -> str | None:
    """A cached file lies at …/snapshots/<commit>/config.json."""
    return path.parent.name if path.parent.parent.name == "snapshots" else None


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.constants  # noqa: F401 - submodules the package loads lazily
        import huggingface_hub.utils  # noqa: F401
    except ImportError:
        raise ModelRefError("expected huggingface_hub for hf:owner/name references; install it with "
                            "pip install 'trainmem[hf]'", where="MODEL") from None
    return huggingface_hub


def _errors(hub):
    """The hub's exception classes: huggingface_hub.errors, or huggingface_hub.utils before 0.20."""
    try:
        import huggingface_hub.errors as errors
    except ImportError:
        return hub.utils
    return errors if hasattr(errors, "LocalEntryNotFoundError") else hub.utils


def _offline(hub) -> bool:
    constants = hub.constants
    return bool(constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE)


def _timeout(hub) -> float:
    """HF_HUB_ETAG_TIMEOUT when set (huggingface_hub reads it into its constants), else HUB_TIMEOUT_S."""
    return getattr(hub.constants, "HF_HUB_ETAG_TIMEOUT", None) or HUB_TIMEOUT_S


def clip_text(text: str, limit: int = 80) -> str:
    """Hostile input can be megabytes long: messages quote at most `limit` characters of it."""
    return text if len(text) <= limit else text[:limit] + f"… ({len(text):,} characters)"
