"""Request and response shapes of vLLM's OpenAI-compatible server, the subset the CPU backend serves.

Field names, defaults and meanings follow vLLM's own protocol models
(vllm/entrypoints/openai/completion/protocol.py: CompletionRequest, CompletionLogProbs,
CompletionResponseChoice, CompletionResponse; vllm/entrypoints/openai/protocol.py:
ModelCard, ModelList, ErrorResponse, UsageInfo). Unknown request fields are accepted and
ignored, as vLLM does (its OpenAIBaseModel has extra="allow").
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    n: int = Field(default=1, ge=1, le=64)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    stream: bool | None = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM: with `logprobs`, tokens are spelled "token_id:{id}" instead of text.
    return_tokens_as_token_ids: bool | None = None
    # vLLM >= 0.10.2: the choice carries `token_ids` (generated) and `prompt_token_ids`.
    return_token_ids: bool | None = None


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None
    prompt_token_ids: list[int] | None = None


class PromptTokenUsageInfo(BaseModel):
    cached_tokens: int | None = None


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[dict[str, Any]] = Field(default_factory=list)


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo
