"""What importing the algorithms loads: the contract needs neither the engine nor the configuration,
and no heavy library a server step uses only sometimes. Every sweep run and every Flower node message
starts a process that imports them, so each second here is paid thousands of times."""

from __future__ import annotations

import json
import subprocess
import sys


def loaded_after(statement: str) -> set[str]:
    """Top-level packages and fedtail subpackages in sys.modules after ``statement``, in a fresh process."""
    code = (
        f"import json, sys\n{statement}\n"
        "print(json.dumps(sorted({'.'.join(m.split('.')[:2]) if m.startswith('fedtail.') else m.split('.')[0] "
        "for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_importing_every_algorithm_loads_neither_the_engine_nor_heavy_libraries():
    loaded = loaded_after("import fedtail.algorithms")
    assert "fedtail.algorithms" in loaded and "torch" in loaded  # the statement ran
    for name in ("fedtail.engine", "fedtail.config", "fedtail.sweep", "fedtail.report", "fedtail.flower"):
        assert name not in loaded, f"importing the algorithms loads {name}"
    for name in ("sklearn", "scipy", "matplotlib", "flwr", "typer", "rich"):
        assert name not in loaded, f"importing the algorithms loads {name}: import it where it is used"


def test_configuration_needs_no_algorithm_registry_and_the_contract_no_engine():
    config = loaded_after("import fedtail.config")
    assert "fedtail.config" in config and not config & {"fedtail.algorithms", "fedtail.engine", "fedtail.components"}
    contract = loaded_after("import fedtail.algorithms.base")
    assert "fedtail.algorithms" in contract and not contract & {"fedtail.engine", "fedtail.config"}


def test_a_clustered_algorithm_still_finds_its_library_when_it_runs():
    loaded = loaded_after(
        "import numpy as np\n"
        "from fedtail.algorithms.clustering import kmeans\n"
        "kmeans(np.array([[0.0], [0.1], [5.0], [5.1]]), 2, seed=0)"
    )
    assert "sklearn" in loaded
