"""What the test fixtures cost a cold run: the seconds each took to make (recorded beside it by tests/fixtures.py),
largest first, over every fixture in the cache (older cache keys' too: each is named by its key).

    .venv/bin/python scripts/fixture_costs.py [--top N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

CACHE = (Path(__file__).resolve().parent.parent / "tests" / ".fixtures").resolve()


def recorded() -> list[tuple[float, str]]:
    costs = []
    for seconds in CACHE.glob("*/*/.seconds"):
        costs.append((float(seconds.read_text()), f"{seconds.parent.parent.name}/{seconds.parent.name}"))
    return sorted(costs, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=30)
    arguments = parser.parse_args()
    costs = recorded()
    for seconds, name in costs[:arguments.top]:
        print(f"{seconds:8.1f} s  {name}")
    print(f"{sum(s for s, _ in costs):8.1f} s  in all, {len(costs)} fixtures recorded")


if __name__ == "__main__":
    main()
