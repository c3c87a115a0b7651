"""Minimal OpenAI-compatible chat-completions client (stdlib urllib only).

Only used when an endpoint is configured; nothing in the service calls it by default.
Every failure (HTTP status, timeout, connection error, malformed response) surfaces as
``LLMError`` so callers can fall back to the rule-based implementations.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Any


class LLMError(RuntimeError):
    """The LLM endpoint failed or returned something unusable."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ChatClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        timeout_s: float = 30.0,
    ) -> None:
        base = base_url.rstrip("/")
        # Accept both ".../v1" and the full ".../v1/chat/completions" URL.
        self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.api_key = api_key
        self.model = model
        self.timeout_s = timeout_s

    @classmethod
    def from_env(cls, prefix: str = "SIDECAR_LLM_") -> ChatClient | None:
        """Client from ``<prefix>BASE_URL``/``API_KEY``/``MODEL``/``TIMEOUT_S``; None if unconfigured."""
        base = os.environ.get(prefix + "BASE_URL")
        if not base:
            return None
        return cls(
            base,
            os.environ.get(prefix + "API_KEY") or None,
            os.environ.get(prefix + "MODEL", "gpt-4o-mini"),
            float(os.environ.get(prefix + "TIMEOUT_S", "30")),
        )

    def complete(
        self, messages: list[dict[str, Any]], *, temperature: float = 0.0, response_format_json: bool = False
    ) -> str:
        """Return the first choice's message content."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": temperature}
        if response_format_json:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(
            self.url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode("utf-8", "replace") if e.fp else ""
            raise LLMError(f"LLM HTTP {e.code} from {self.url}: {detail}", status=e.code) from e
        except TimeoutError as e:
            raise LLMError(f"LLM request to {self.url} timed out after {self.timeout_s}s") from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise LLMError(f"LLM request to {self.url} timed out after {self.timeout_s}s") from e
            raise LLMError(f"LLM request to {self.url} failed: {e.reason}") from e
        except OSError as e:
            raise LLMError(f"LLM request to {self.url} failed: {e}") from e
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise LLMError(f"malformed chat-completions response: {raw[:200]!r}") from e
        if not isinstance(content, str):
            raise LLMError("chat-completions response has no text content")
        return content


_FENCE_RE = re.compile(r"^```(?:json)?\s*|\s*```$", re.I)


def parse_json_content(content: str) -> Any:
    """Parse a model's JSON answer, tolerating ```json fences and prose around the JSON."""
    text = _FENCE_RE.sub("", content.strip())
    try:
        return json.loads(text)
    except ValueError:
        pass
    # Try the outermost object/array, whichever opens first.
    pairs = sorted((("{", "}"), ("[", "]")), key=lambda p: (text.find(p[0]) < 0, text.find(p[0])))
    for open_ch, close_ch in pairs:
        start, end = text.find(open_ch), text.rfind(close_ch)
        if 0 <= start < end:
            try:
                return json.loads(text[start : end + 1])
            except ValueError:
                continue
    raise LLMError(f"model did not return JSON: {content[:200]!r}")


__all__ = ["ChatClient", "LLMError", "parse_json_content"]
