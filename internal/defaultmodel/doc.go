// Package defaultmodel embeds the model Tandem serves when no --model is
// given: stories260K, Andrej Karpathy's 260K-parameter Llama-architecture
// model from llama2.c, trained on the TinyStories data set (MIT license;
// provenance and license text in stories260K/NOTICE.md, which ships with
// it). It writes short children's stories, so a fresh `tandem up` answers in
// words rather than the noise of a random-weight model, and its greedy
// output is a known text, so the answer also shows the engine computes
// correctly.
//
// The files are those of the Hugging Face layout in the shared test models
// (stories260K/hf, where package testmodels finds it), byte for byte, plus
// one of ours, chat_template.jinja. The engines load models from a directory, so Install
// writes the files once into the user's cache (beside where `tandem up` used
// to make its random-weight model) and returns that directory.
//
// # Chat template
//
// The model has no chat training, so its template is plain text: after the
// BOS token, each user or assistant message is one paragraph (its content,
// trimmed, then a newline); system messages are left out, because the model
// cannot follow instructions. The generation prompt is that newline, so a
// chat answer is the story's next paragraph ("Tell me a story." gets "One
// day, Tom and his mom went to the store. ..."). With add_generation_prompt
// false (vLLM's extension) the answer continues the last message's text
// instead, exactly as a completion of the same prompt would.
//
// The template is its own file rather than a chat_template field added to
// tokenizer_config.json: the tokenizer already reads chat_template.jinja (as
// transformers saves it), every other file stays identical to the shared
// copy (a test compares them byte for byte, with no exception to carve out
// of a JSON file), and the template reads as Jinja rather than as an escaped
// JSON string.
package defaultmodel
