"""Import stand-ins for modules Dynamo 1.6.1 imports but the replay runs here never use.

`ai-dynamo` 1.6.1 requires `aisimulate==0.13.0`, a placeholder on PyPI that downloads the real
package from NVIDIA's own index, and its planner imports the clients and numerical libraries of
features the offline replay does not exercise. `tools/dynamo-venv.sh` installs Dynamo without
them; this module lets those imports succeed inside the replay harness only (it is not
installed in the virtual environment).

Nothing here imitates any of them: every name a stand-in module is asked for is a class that
raises `StandInUsed` when called or instantiated, so a code path that does use one of these
packages fails loudly instead of running on a fake. What each one would serve:

- `aisimulate`, `aisimulate_core`: AISimulate, the performance model behind the planner's
  `optimization_target: sla` (its throughput floor and its load loop's TTFT/ITL estimates)
  and AIC profiling. Without it that mode cannot size anything.
- `sklearn`: imported with those performance models.
- `pandas`, `pmdarima`, `prophet`, `filterpy`: the planner's load predictors (ARIMA, Prophet,
  Kalman), used by `optimization_target: sla` only.
- `kubernetes`, `prometheus_api_client`, `requests`: the planner's Kubernetes connector and
  Prometheus client; the offline replay feeds the planner directly.
- `plotly`: the planner's HTML diagnostics report (the harness turns it off).
"""

import importlib.abc
import importlib.machinery
import sys
import types

ABSENT = (
    "aisimulate",
    "aisimulate_core",
    "sklearn",
    "pandas",
    "pmdarima",
    "prophet",
    "filterpy",
    "kubernetes",
    "prometheus_api_client",
    "requests",
    "plotly",
)


class StandInUsed(RuntimeError):
    """A stand-in was called: the code path needs the real package."""


class _Absent(type):
    """A name from a stand-in module: a class that fails when used."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise StandInUsed(
            f"{cls.__qualname__} was used, but its package is not installed here "
            "(tools/replay/standin.py lists what each stand-in would serve)"
        )


def _absent(qualname):
    return _Absent(qualname, (), {"__qualname__": qualname})


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def missing(name, _module=spec.name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _absent(f"{_module}.{name}")

        module.__getattr__ = missing
        return module

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ABSENT:
            return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
        return None


def install():
    """Puts the stand-ins behind every real package (a real one installed wins)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
