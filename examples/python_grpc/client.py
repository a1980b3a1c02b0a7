#!/usr/bin/env python3
"""A Python gRPC client of tessera.v1.Inference (Debian's python3-grpcio).

    TESSERA_GRPC=127.0.0.1:50051 ./run.sh [--check]

run.sh generates the stubs from proto/ with protoc's Python plugin into a
temporary folder and puts it on PYTHONPATH. This client lists the models,
streams a Generate (text prompt) and a Chat with a tool, and prints the
deltas. With --check it asserts what the test cluster's scripted model
answers (tests/integration/chat_fixture.h) and exits 1 on a mismatch.
"""
import json
import os
import sys

import grpc
from tessera.v1 import inference_pb2, inference_pb2_grpc


def main() -> int:
    check = "--check" in sys.argv
    target = os.environ.get("TESSERA_GRPC", "127.0.0.1:50051")
    metadata = []
    if os.environ.get("TESSERA_API_KEY"):
        metadata.append(("authorization", "Bearer " + os.environ["TESSERA_API_KEY"]))
    failures = 0

    def expect(what, ok, got):
        nonlocal failures
        print(("ok   " if ok else "FAIL ") + what + ("" if ok else f": got {got!r}"))
        failures += 0 if ok else 1

    with grpc.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        models = stub.ListModels(inference_pb2.ListModelsRequest(), metadata=metadata)
        print("models:", [(m.name, m.context_length, m.healthy_workers) for m in models.models])

        # Generate: a text prompt, streamed.
        req = inference_pb2.GenerateRequest(text="Say hello")
        req.sampling.max_tokens = 12
        req.sampling.temperature = 0
        text, complete = "", None
        for resp in stub.Generate(req, metadata=metadata):
            if resp.HasField("chunk"):
                text += resp.chunk.text
            else:
                complete = resp.complete
        print("generate:", repr(text), "usage:", complete.usage.completion_tokens)
        if check:
            expect("generate text", text == "<think>\nA gr", text)
            expect("generate usage", complete.usage.completion_tokens == 12, complete.usage)

        # Chat with a tool: reasoning and a tool call come apart.
        chat = inference_pb2.ChatRequest()
        chat.messages.add(role="user", content="Weather in Paris?")
        chat.tools.add(name="get_weather", description="Weather of a city",
                       parameters_json=json.dumps({"type": "object",
                                                   "properties": {"city": {"type": "string"}}}))
        reasoning, content, calls = "", "", []
        for resp in stub.Chat(chat, metadata=metadata):
            if resp.HasField("chunk"):
                reasoning += resp.chunk.reasoning
                content += resp.chunk.text
                calls.extend(resp.chunk.tool_calls)
        print("chat reasoning:", repr(reasoning))
        print("chat tool calls:", [(c.name, c.arguments) for c in calls])
        if check:
            expect("chat reasoning", reasoning.strip() == "The user wants the weather: call the tool.",
                   reasoning)
            expect("chat tool call", len(calls) == 1 and calls[0].name == "get_weather" and
                   json.loads(calls[0].arguments) == {"city": "Paris"}, calls)

        # A refused request is a gRPC status.
        try:
            for _ in stub.Chat(inference_pb2.ChatRequest(), metadata=metadata):
                pass
            expect("empty chat refused", False, "accepted")
        except grpc.RpcError as e:
            expect("empty chat is INVALID_ARGUMENT",
                   e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.code())
    if failures:
        print(f"{failures} check(s) failed")
        return 1
    print("all checks passed" if check else "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
