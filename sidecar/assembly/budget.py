"""Token budgets of one BuildContext call: the seed's defaults, every field overridable."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sidecar.errors import InvalidArgument

MAX_BUDGET_TOKENS = 10_000_000


@dataclass(frozen=True, slots=True)
class Budget:
    max_input: int = 24_000
    reserved_for_output: int = 1_500
    system_and_tools: int = 4_000
    session_state: int = 1_000
    recent_messages: int = 6_000
    memories: int = 2_000
    rag_or_graph: int = 6_000
    tool_observations: int = 4_000
    flow_unused: bool = True

    @property
    def total(self) -> int:
        """What the prompt may use: the window minus the answer's reserve."""
        return self.max_input - self.reserved_for_output

    @classmethod
    def from_overrides(cls, overrides: dict[str, int | bool]) -> Budget:
        for name, value in overrides.items():
            if isinstance(value, bool):
                continue
            if value < 0 or value > MAX_BUDGET_TOKENS:
                raise InvalidArgument(f"budget.{name} must be 0-{MAX_BUDGET_TOKENS} (got {value})")
        budget = cls(**overrides)
        if budget.total <= 0:
            raise InvalidArgument(f"budget.reserved_for_output ({budget.reserved_for_output}) leaves nothing of "
                                  f"budget.max_input ({budget.max_input})")
        return budget


BUDGET_FIELDS = tuple(f.name for f in fields(Budget))
DEFAULT_BUDGET = Budget()
