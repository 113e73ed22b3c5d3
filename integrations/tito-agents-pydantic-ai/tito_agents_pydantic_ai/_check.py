"""Model requests counted per episode, so requests that went around capture are never silent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse
from pydantic_ai.tools import RunContext

from tito_agents.integration import current_episode
from tito_agents_pydantic_ai._attribution import FRAMEWORK

if TYPE_CHECKING:
    from pydantic_ai.models import ModelRequestContext


@dataclass
class CaptureCheck(AbstractCapability[Any]):
    """A PydanticAI capability that tells the episode of each model request that the agent made
    one (`Episode.note_model_call`): at the episode's end the collector compares them with the
    requests capture sent, and logs and counts the difference
    (`collector.stats.bypassed_calls`, `EpisodeReport.bypassed_calls`) with the fix — a model
    whose client is not the wrapped one, a response cache. Add it to each agent:
    `Agent(model, capabilities=[CaptureCheck()])`.

    Only responses a provider answered are counted (they carry its response id); a response a
    hook made up after an error sent nothing to count against."""

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        episode = current_episode()
        if episode is not None and response.provider_response_id is not None:
            episode.note_model_call(FRAMEWORK)
        return response
