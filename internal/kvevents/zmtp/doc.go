// Package zmtp is the subset of ZMTP 3.x (https://rfc.zeromq.org/spec/23/
// and /37/) that KV events need: the NULL security mechanism and the
// framing of PUB/SUB and ROUTER/DEALER(REQ), over TCP. It speaks to libzmq
// peers (pyzmq in vLLM, llm-d's and Dynamo's indexers) as a PUB or ROUTER,
// and to libzmq or Tandem publishers as a SUB or DEALER.
//
// A PubSocket binds (ListenPub) or dials (DialPub) and sends each message
// to every peer subscribed to a prefix of its first frame, through a
// bounded queue per peer (libzmq's per-peer high-water mark): a peer that
// stalls misses messages, the others do not wait for it. A RouterSocket
// (ListenRouter) hands each request to a Handler that answers on the same
// connection. Dial connects a SUB or DEALER. Both listening sockets accept
// at most Options.MaxPeers connections at once; one more is closed on
// accept.
//
// Why not github.com/go-zeromq/zmq4 (v0.17): its PUB writes each message to
// every subscriber in turn from one goroutine, so one stalled subscriber
// stalls all of them, and its high-water mark drops for the whole socket;
// its SUB does not tell the caller that the publisher went away (automatic
// reconnection re-dials from the connection reaper and writes the endpoint
// unguarded). Here each subscriber has its own bounded queue and a
// subscriber sees the connection end, which is what restart detection
// needs. Everything that reads from the network (frames, messages, the
// READY command's metadata) is bounded and fuzzed.
package zmtp
