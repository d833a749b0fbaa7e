// Streams a chat answer from the default model (or -model PATH) to stdout.
//
//	go run ./examples/chat -q "What is the capital of France?"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"selfserve"
)

func main() {
	modelPath := flag.String("model", "", "GGUF file or Hugging Face folder (default: the default model)")
	question := flag.String("q", "Write a haiku about the sea.", "the question")
	maxTokens := flag.Int("n", 128, "tokens at most")
	temperature := flag.Float64("t", 0.7, "sampling temperature (0: greedy)")
	flag.Parse()

	model, err := selfserve.Load(*modelPath)
	if err != nil {
		fail(err)
	}
	defer model.Close()
	engine, err := selfserve.NewEngine(model, selfserve.EngineOptions{})
	if err != nil {
		fail(err)
	}
	defer engine.Close()

	// Ctrl-C cancels the request in the engine.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	stream, err := engine.Chat(ctx, []selfserve.Message{{Role: "user", Content: *question}},
		selfserve.Request{MaxTokens: *maxTokens, Temperature: float32(*temperature), Seed: -1})
	if err != nil {
		fail(err)
	}
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Println()
			fail(err)
		}
		fmt.Print(ev.Text)
		if ev.Finish != selfserve.FinishNone {
			fmt.Fprintf(os.Stderr, "\n[%s: %d prompt + %d generated tokens on %s]\n", ev.Finish,
				ev.Usage.PromptTokens, ev.Usage.CompletionTokens, engine.Device())
		}
	}
}

func fail(err error) {
	var se *selfserve.Error
	if errors.As(err, &se) && se.File != "" {
		fmt.Fprintf(os.Stderr, "chat: %s (%s, at %s:%d)\n", se.Message, se.Code, se.File, se.Line)
	} else {
		fmt.Fprintln(os.Stderr, "chat:", err)
	}
	os.Exit(1)
}
