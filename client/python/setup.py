"""Builds dispatchd/v1 (the messages, their .pyi stubs and the gRPC stubs) from proto/ as the
package is built, with protoc and grpc_python_plugin (Debian's protobuf-compiler and
protobuf-compiler-grpc; grpcio-tools is not needed). Everything else is in pyproject.toml.

Where the tools and protos are, each overridable from the environment:
  PROTOC               protoc (default: the one on PATH)
  GRPC_PYTHON_PLUGIN   grpc_python_plugin (default: the one on PATH)
  DISPATCHD_PROTO_DIR  the directory holding dispatchd/v1/*.proto (default: ../../proto, the
                       repository's proto/ beside client/python)
"""

import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import SetupError

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["dispatchd/v1/job.proto", "dispatchd/v1/job_service.proto",
          "dispatchd/v1/worker_service.proto", "dispatchd/v1/admin_service.proto"]


def _tool(env, name):
    path = os.environ.get(env) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        raise SetupError(f"{name} not found: install it (Debian: protobuf-compiler, "
                         f"protobuf-compiler-grpc) or set {env}")
    return path


class BuildPyWithProtos(build_py):
    """build_py, then the generated modules of PROTOS into the build directory."""

    def run(self):
        super().run()
        proto_dir = os.environ.get("DISPATCHD_PROTO_DIR") or os.path.join(HERE, "..", "..",
                                                                           "proto")
        missing = [p for p in PROTOS if not os.path.isfile(os.path.join(proto_dir, p))]
        if missing:
            raise SetupError(f"{os.path.join(proto_dir, missing[0])} not found: build from the "
                             "dispatchd repository (client/python beside proto/) or set "
                             "DISPATCHD_PROTO_DIR")
        protoc = _tool("PROTOC", "protoc")
        plugin = _tool("GRPC_PYTHON_PLUGIN", "grpc_python_plugin")
        out = self.build_lib
        # Modules a previous build generated from a proto since removed must not linger.
        for old in glob.glob(os.path.join(out, "dispatchd", "v1", "*_pb2*.py*")):
            os.remove(old)
        self.announce(f"generating dispatchd/v1 from {proto_dir}", level=2)
        subprocess.run([protoc, "-I", proto_dir, f"--python_out={out}", f"--pyi_out={out}",
                        f"--grpc_python_out={out}", f"--plugin=protoc-gen-grpc_python={plugin}",
                        *PROTOS], check=True)

    def get_outputs(self, include_bytecode=1):
        outputs = list(super().get_outputs(include_bytecode))
        for proto in PROTOS:
            stem = os.path.join(self.build_lib, proto[:-len(".proto")])
            outputs += [stem + "_pb2.py", stem + "_pb2.pyi", stem + "_pb2_grpc.py"]
        return outputs


setup(cmdclass={"build_py": BuildPyWithProtos})
