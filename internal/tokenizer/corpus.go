package tokenizer

// fixtureCorpus is the English text WriteFixture learns its merges from. It
// was written for this package (no third-party text), covers everyday words,
// punctuation, digits, code-like text and a little non-ASCII, and is fixed so
// that the written tokenizer is the same on every run.
const fixtureCorpus = `Once upon a time, in a small town by the sea, there lived a girl named Mira.
Every morning she walked to the harbor to watch the boats come in. The fishermen
waved at her, and she waved back. One day she found a little blue shell on the
sand. "What a beautiful shell!" she said. She took it home and put it on the
table next to her bed. That night, the shell began to sing a quiet song.

Mira was not afraid. She listened to the song and fell asleep. In her dream she
was swimming with the fish, deep in the water, where the light was green and the
sand was soft. When she woke up, she told her mother about the dream. Her mother
smiled and said, "Maybe the sea wants to be your friend."

The next day it rained. Mira stayed inside and read a book about the ocean. She
learned that some whales sing for hours, that octopuses have three hearts, and
that the deepest part of the sea is almost eleven kilometers down. She wrote the
numbers in her notebook: 3 hearts, 11 kilometers, 52 hertz, 1,000 meters, 2024.

A server that answers questions has to be fast and correct. When a request
arrives, the server reads the prompt, turns the text into tokens, and runs the
model one step at a time. Each step produces the next token, and the server
sends it back to the client as soon as it is ready. If the client goes away, the
server stops the work and frees the memory it was using. Good systems measure
everything: how long the first token takes, how many tokens per second come out,
and how much memory is still free.

    func main() {
        for i := 0; i < 10; i++ {
            fmt.Println("hello, world", i)
        }
    }

The weather was warm and the children played in the park. They ran, they
jumped, they laughed, and they shared their apples and bread. The dog chased a
ball across the grass and brought it back again and again. When the sun went
down, everyone went home, tired and happy. It was a good day.

Questions people ask: What is the time? Where is the station? How much does it
cost? Why is the sky blue? Who wrote this book? Which way is north? Can you help
me, please? Thank you very much. You're welcome. I'm sure we'll find it. They've
already left, haven't they? It's fine; don't worry.

Some words from other places: café, naïve, résumé, façade, Zürich, São Paulo,
München, Ångström. Prices: $4.99, €12, £7.50. Math: 2 + 2 = 4, 10 / 5 = 2,
x * y >= z. Paths and addresses: /usr/local/bin, https://example.com/docs,
user@example.com. Lists: first, second, third; red, green, blue.

The old library had tall windows and long wooden tables. People came to read,
to write, and to think. The librarian knew where every book was, and she always
had time to help. "Knowledge grows when it is shared," she liked to say, and the
readers agreed. On quiet afternoons the only sounds were pages turning and rain
on the glass.
`
