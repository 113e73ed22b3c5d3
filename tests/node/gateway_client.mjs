// The official openai Node.js client, given only a base URL, as a harness in another language
// would use the capture gateway. Usage: node gateway_client.mjs BASE_URL MODEL
// Prints one JSON line: the response ids and the token ids each call received.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "node-agent-key", maxRetries: 0 });
const messages = [{ role: "user", content: "Hello from Node.js" }];

const reply = await client.chat.completions.create({
  model,
  messages,
  max_tokens: 16,
  temperature: 1.0,
  return_token_ids: true,
});
const json = {
  id: reply.id,
  prompt_token_ids: reply.prompt_token_ids,
  token_ids: reply.choices[0].token_ids,
};

const stream = await client.chat.completions.create({
  model,
  messages,
  max_tokens: 16,
  temperature: 1.0,
  stream: true,
});
const streamed = { id: null, prompt_token_ids: null, token_ids: [], text: "" };
for await (const chunk of stream) {
  streamed.id = chunk.id;
  streamed.prompt_token_ids ??= chunk.prompt_token_ids ?? null;
  for (const choice of chunk.choices) {
    streamed.token_ids.push(...(choice.token_ids ?? []));
    streamed.text += choice.delta?.content ?? "";
  }
}
process.stdout.write(JSON.stringify({ json, stream: streamed }) + "\n");
