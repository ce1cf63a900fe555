"""The package top: every public name resolves, importing it stays light, and entry points
take their options by keyword."""

import inspect
import subprocess
import sys
import typing

import dysco_interp

ENTRY_POINTS = ("load_model", "generate", "generate_batch", "compare_methods", "detect_qr_heads", "make_dataset",
                "load_heads", "evaluate")


def test_every_public_name_resolves_and_is_listed():
    for name in dysco_interp.__all__:
        assert getattr(dysco_interp, name) is not None, name
    assert set(ENTRY_POINTS) <= set(dysco_interp.__all__)
    assert {"HeadSet", "DecodingConfig", "preset"} <= set(dir(dysco_interp))


def test_importing_the_package_loads_no_torch():
    code = "import sys, dysco_interp; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_entry_points_take_options_by_keyword_and_document_them():
    for name in ENTRY_POINTS:
        fn = getattr(dysco_interp, name)
        params = list(inspect.signature(fn).parameters.values())
        optional = [p for p in params if p.default is not inspect.Parameter.empty]
        positional_options = [p.name for p in optional if p.kind is p.POSITIONAL_OR_KEYWORD]
        # at most the first two options (config, heads) may be passed by position
        assert len(positional_options) <= 2, f"{name}: {positional_options}"
        doc = inspect.getdoc(fn) or ""
        assert "Args:" in doc and "Returns:" in doc, name


def test_methods_and_backends_are_literal_types():
    from dysco_interp.decoding import methods
    from dysco_interp.decoding.backends import BACKENDS, BackendName
    from dysco_interp.decoding.choices import MethodName

    # the built-in ones, registered first: a researcher's own methods join the registry at run time
    assert typing.get_args(MethodName) == tuple(methods.REGISTRY)[:len(typing.get_args(MethodName))]
    assert typing.get_args(BackendName) == BACKENDS
    hints = typing.get_type_hints(dysco_interp.DecodingConfig)
    assert hints["method"] == MethodName


def test_the_built_in_methods_register_through_the_public_function():
    from dysco_interp.decoding import methods

    # every method class of the module is registered (by `register_method`, as a researcher's is),
    # and registering one again is harmless
    defined = [cls for cls in vars(methods).values()
               if isinstance(cls, type) and issubclass(cls, methods.Method) and cls.__module__ == methods.__name__]
    registered = [cls for cls in methods.REGISTRY.values() if cls.__module__ == methods.__name__]
    assert set(defined) == set(registered) and all(methods.METHODS[cls.name] == cls.description for cls in defined)
    assert all(methods.register_method(cls) is cls for cls in registered)
    assert [cls.name for cls in registered] == list(methods.REGISTRY)[:len(registered)]
