"""Secrets never reach the database, the logs autotune keeps, `show` or an export.

A study may carry secrets in three places: the engine's environment (`engine.env: {HF_TOKEN: ...}`,
or autotune's own environment, which the server inherits), the engine flags (`--api-key KEY`,
`--hf-token TOKEN`) and the engine command (`docker run -e HF_TOKEN=... image`). Two layers keep them
out of everything that is stored or shown:

- by value: a `Redactor` made for the study knows the actual secret strings and replaces them wherever
  they appear (a server log that echoes its arguments, an error message quoting a URL with a token);
- by shape: whatever text reaches the store is also scrubbed of the shapes of secrets whose value is
  not known (`--api-key X`, `api_key: X`, `HF_TOKEN=X`, `hf_...` tokens), so a caller that forgot to
  redact leaks nothing.

The engine itself still receives the real values: only what autotune writes down is redacted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

REDACTED = "***"
# Flags whose value is a secret (vLLM's names; `--hf-token` may also stand alone, meaning "use the stored one").
SECRET_FLAGS = ("--api-key", "--hf-token")
# Environment names whose value is a secret: anything naming a token, an API key, a secret or a password
# (not AUTH or CREDENTIALS: SSH_AUTH_SOCK and GOOGLE_APPLICATION_CREDENTIALS hold paths).
_SECRET_NAME = re.compile(r"(?:TOKEN|API_?KEY|SECRET|PASSWORD|PASSWD)", re.I)
_MIN_SECRET_LEN = 6   # shorter values ("1", "true") are not worth hiding and would garble every text

_SHAPES = (
    # --api-key VALUE / --api-key=VALUE / --hf-token VALUE (quoted or not)
    re.compile(r"(--(?:api-key|hf-token)(?:=|\s+)['\"]?)(?!-)([^\s'\",]+)"),
    # api_key: 'VALUE' / "api_key": "VALUE" / api-key=VALUE (vLLM's "non-default args" dict, YAML, JSON)
    re.compile(r"((?:api[_-]key|hf[_-]token)['\"]?\s*[:=]\s*['\"]?)(?!\*\*\*)([^\s'\",}]+)", re.I),
    # NAME_TOKEN=VALUE, -e HF_TOKEN=VALUE (environment assignments in a command or a log)
    re.compile(r"(\b[A-Z0-9_]*(?:TOKEN|API_KEY|APIKEY|SECRET|PASSWORD)[A-Z0-9_]*=)([^\s'\"]+)"),
    # Bearer VALUE (an Authorization header in an error message)
    re.compile(r"(Bearer\s+)([A-Za-z0-9._~+/=-]{6,})"),
    # Hugging Face tokens by their prefix, wherever they appear
    re.compile(r"()(\bhf_[A-Za-z0-9]{20,})"),
)


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def secret_env_values(env: Mapping[str, str]) -> set[str]:
    """The values of variables whose name says they hold a secret."""
    return {v for k, v in env.items() if _SECRET_NAME.search(k) and isinstance(v, str) and len(v) >= _MIN_SECRET_LEN}


def secret_flag_values(argv: Sequence[str]) -> set[str]:
    """Values given to SECRET_FLAGS in an argument list (both `--f V` and `--f=V`)."""
    out: set[str] = set()
    for i, item in enumerate(argv):
        item = str(item)
        name, eq, value = item.partition("=")
        if name in SECRET_FLAGS:
            if eq:
                out.add(value)
            elif i + 1 < len(argv) and not str(argv[i + 1]).startswith("--"):
                out.add(str(argv[i + 1]))
        elif eq and not item.startswith("-"):
            out |= secret_env_values({name: value})  # `-e HF_TOKEN=...` in a container command
    return {v for v in out if len(v) >= _MIN_SECRET_LEN}


def api_key_of(flags: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key a server started with these flags and environment expects (vLLM: `--api-key`, else the
    VLLM_API_KEY variable), so the load client can send it."""
    found: str | None = None
    for i, item in enumerate(str(f) for f in flags):   # the last one wins, as in argparse
        name, eq, value = item.partition("=")
        if name == "--api-key":
            found = value if eq else (str(flags[i + 1]) if i + 1 < len(flags) else None)
    return found or env.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def redact_flags(argv: Sequence[str]) -> list[str]:
    """The argument list with every secret flag's value replaced by REDACTED (the flag itself kept)."""
    out: list[str] = []
    hide_next = False
    for item in (str(a) for a in argv):
        if hide_next and not item.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = item.partition("=")
        if name in SECRET_FLAGS:
            out.append(f"{name}={REDACTED}" if eq else item)
            hide_next = not eq
            continue
        out.append(scrub(item))
    return out


def scrub(text: str) -> str:
    """Remove the shapes of secrets from text whose secret values are not known."""
    for pattern in _SHAPES:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


class Redactor:
    """Replaces a study's known secret values, then the shapes of unknown ones."""

    def __init__(self, values: Iterable[str] = ()):
        # Longest first, so a secret that contains another is replaced whole.
        self.values = sorted({v for v in values if v and len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)

    @classmethod
    def for_engine(cls, env: Mapping[str, str], flags: Sequence[str], command: Sequence[str] = ()) -> "Redactor":
        """The secrets of one study: its engine env, autotune's own environment (inherited by the server),
        the secret flags among its engine flags, and assignments in its engine command."""
        return cls(secret_env_values(env) | secret_env_values(dict(os.environ))
                   | secret_flag_values(list(flags)) | secret_flag_values(list(command)))

    def text(self, text: str | None) -> str | None:
        if not text:
            return text
        for value in self.values:
            text = text.replace(value, REDACTED)
        return scrub(text)

    def obj(self, value: Any) -> Any:
        """Every string inside a JSON-like value, redacted (dict keys included)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.obj(k): self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            if value and all(isinstance(v, str) for v in value):
                value = redact_flags(value)   # an argument list: `--api-key`, then its value as the next item
            return [self.obj(v) for v in value]
        return value

    def file(self, path: Path) -> None:
        """Rewrite a regular log file with its secrets replaced (write-then-rename); devices, links to
        them and files that cannot be read or written are left alone: redaction never fails a trial."""
        try:
            if not path.is_file() or path.is_symlink() or path.stat().st_size > 256 * 1024**2:
                return
            raw = path.read_bytes()
            text = raw.decode("utf-8", errors="surrogateescape")
            clean = self.text(text) or ""
            if clean == text:
                return
            tmp = path.with_name(path.name + ".redacting")
            tmp.write_bytes(clean.encode("utf-8", errors="surrogateescape"))
            os.replace(tmp, path)
        except OSError:
            return
