"""The agent's control plane seen by a gRPC client nobody here wrote (Python grpcio):
reflection lists the dpuio services, the health service answers, and a call built
only from reflected descriptors works."""

import os
import re
import select
import subprocess
import sys
import tempfile
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

#: Seconds any call or the agent's start may take: a stuck agent fails a test, it does not
#: hang the suite.
DEADLINE = 180

BIN_DIR = os.environ.get("DPUIO_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../target/debug"))


@pytest.fixture(scope="module")
def agent():
    """A fresh agent (mutual TLS, development PKI) and the client bundle it wrote."""
    data = tempfile.mkdtemp(prefix="dpuio-py-")
    bundle = os.path.join(data, "client")
    # A scratch HOME too: nothing of the user's home directory is read or written.
    home = os.path.join(data, ".home")
    os.makedirs(home)
    proc = subprocess.Popen(
        [os.path.join(BIN_DIR, "dpu-agent"), "serve", "--data-dir", data, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": home, "DPUIO_CONFIG_DIR": bundle},
    )
    ready, _, _ = select.select([proc.stdout], [], [], DEADLINE)
    if not ready:
        proc.kill()
        pytest.fail(f"dpu-agent printed nothing within {DEADLINE} s of its start", pytrace=False)
    line = proc.stdout.readline()
    match = re.match(r"dpu-agent listening on (\S+)", line)
    assert match, f"unexpected first line: {line!r}"
    # Read the rest (UCX writes its warnings there): left in the pipe, 64 KiB of it would
    # block the agent in a write.
    threading.Thread(target=_forward, args=(proc.stdout,), daemon=True).start()
    yield match.group(1), bundle
    proc.terminate()
    assert proc.wait(timeout=20) == 0


def _forward(stream):
    """Copy the agent's standard output to this process's standard error, line by line."""
    for line in stream:
        sys.stderr.write(f"dpu-agent: {line}")


def secure_channel(agent):
    address, bundle = agent

    def read(name):
        with open(os.path.join(bundle, name), "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"), private_key=read("client.key"), certificate_chain=read("client.pem")
    )
    return grpc.secure_channel(address, credentials)


def test_no_client_certificate_is_unauthenticated(agent):
    address, bundle = agent
    with open(os.path.join(bundle, "ca.pem"), "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    with grpc.secure_channel(address, credentials) as channel:
        with pytest.raises(grpc.RpcError) as e:
            list_services(channel)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no client certificate" in e.value.details()


def list_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = list(stub.ServerReflectionInfo(iter([request]), timeout=DEADLINE))
    return sorted(s.name for s in responses[0].list_services_response.service)


def test_reflection_lists_dpuio_and_health(agent):
    with secure_channel(agent) as channel:
        services = list_services(channel)
    assert "dpuio.v1.Session" in services
    assert "dpuio.v1.Namespace" in services
    assert "grpc.health.v1.Health" in services


def test_health_serving(agent):
    with secure_channel(agent) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ["", "dpuio.v1.Session", "dpuio.v1.Namespace"]:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_call_built_from_reflected_descriptors(agent):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    with secure_channel(agent) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        def ask(**kwargs):
            reply = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(**kwargs)]), timeout=DEADLINE))[0]
            return [descriptor_pb2.FileDescriptorProto.FromString(b) for b in reply.file_descriptor_response.file_descriptor_proto]

        # Fetch the file with the service, then its imports by name, and load them in
        # dependency order, as any reflection client does.
        files = {f.name: f for f in ask(file_containing_symbol="dpuio.v1.Session")}
        missing = [d for f in files.values() for d in f.dependency if d not in files]
        while missing:
            for f in ask(file_by_filename=missing.pop()):
                files.setdefault(f.name, f)
            missing = [d for f in files.values() for d in f.dependency if d not in files]
        pool = descriptor_pool.DescriptorPool()
        pending = dict(files)
        while pending:
            for name, f in list(pending.items()):
                if all(dep not in pending for dep in f.dependency):
                    pool.Add(f)
                    del pending[name]
        attach_req = message_factory.GetMessageClass(pool.FindMessageTypeByName("dpuio.v1.AttachRequest"))
        attach_resp = message_factory.GetMessageClass(pool.FindMessageTypeByName("dpuio.v1.AttachResponse"))
        attach = channel.unary_unary(
            "/dpuio.v1.Session/Attach",
            request_serializer=attach_req.SerializeToString,
            response_deserializer=attach_resp.FromString,
        )
        reply = attach(attach_req(client_name="python grpcio"), timeout=DEADLINE)
        assert reply.tenant == "default"
        assert reply.session_id != 0

        with pytest.raises(grpc.RpcError) as err:
            attach(attach_req(tenant="nobody"), timeout=DEADLINE)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "nobody" in err.value.details()
