"""Generates the gRPC stubs from the repository's proto/ at build time
and puts them in the wheel as idgen_client/_pb/ (nothing generated is
committed). The proto is found at ../../proto (a wheel built from the
repository) or ./proto (a wheel built from the sdist, which carries it).
The build fails if the generated code needs a newer grpcio or protobuf
than the floors pyproject.toml states."""

import re
import shutil
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = Path("idgen/v1/idgen.proto")


def _version(text):
    return tuple(int(p) for p in text.split("."))


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        from grpc_tools import protoc

        root = Path(self.root)
        include = next(
            (d for d in (root / "proto", root.parent.parent / "proto") if (d / PROTO).is_file()),
            None,
        )
        if include is None:
            raise RuntimeError(
                "idgen-client: proto/idgen/v1/idgen.proto not found beside the package or at "
                "../../proto: build from the repository's clients/python or from its sdist"
            )
        self._out = Path(tempfile.mkdtemp(prefix="idgen-client-stubs-"))
        well_known = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{include}",
            f"-I{well_known}",
            f"--python_out={self._out}",
            f"--pyi_out={self._out}",
            f"--grpc_python_out={self._out}",
            str(PROTO),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"idgen-client: protoc failed on {include / PROTO}")
        gen = self._out / "idgen" / "v1"
        grpc_file = gen / "idgen_pb2_grpc.py"
        text = grpc_file.read_text()
        # The stubs live in idgen_client._pb, not in a top-level `idgen`
        # package (the proto's file name, and so its descriptor, stay).
        text = text.replace("from idgen.v1 import idgen_pb2", "from idgen_client._pb import idgen_pb2")
        grpc_file.write_text(text)
        self._check_floors(text, (gen / "idgen_pb2.py").read_text())
        for name in ("idgen_pb2.py", "idgen_pb2.pyi", "idgen_pb2_grpc.py"):
            build_data["force_include"][str(gen / name)] = f"idgen_client/_pb/{name}"

    def _check_floors(self, grpc_text, pb_text):
        floors = {}
        for dep in self.metadata.core.dependencies:
            m = re.match(r"^(grpcio|protobuf)>=([0-9.]+)", dep)
            if m:
                floors[m.group(1)] = _version(m.group(2))
        grpc_needs = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", grpc_text)
        pb_needs = re.search(r"# Protobuf Python Version: ([0-9.]+)", pb_text)
        for name, found in (("grpcio", grpc_needs), ("protobuf", pb_needs)):
            if found is None:
                raise RuntimeError(f"idgen-client: cannot tell which {name} the stubs need")
            needs = _version(found.group(1))
            if name not in floors or floors[name] < needs:
                raise RuntimeError(
                    f"idgen-client: the generated stubs need {name}>={found.group(1)}: "
                    f"raise the floor in pyproject.toml's dependencies"
                )

    def finalize(self, version, build_data, artifact_path):
        shutil.rmtree(getattr(self, "_out", ""), ignore_errors=True)
