// A Go control plane over the C++ data plane: a small HTTP service with one chat endpoint, each
// request generated through the SDK under the HTTP request's own context (a client that goes away
// cancels its generation in the engine; -timeout bounds every request).
//
//	go run ./examples/httpserver -addr :8080 &
//	curl -N localhost:8080/chat -d '{"messages":[{"role":"user","content":"Hi!"}],"stream":true}'
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log"
	"net/http"
	"time"

	"selfserve"
)

type chatRequest struct {
	Messages    []selfserve.Message `json:"messages"`
	MaxTokens   int                 `json:"max_tokens"`
	Temperature float32             `json:"temperature"`
	Stream      bool                `json:"stream"`
}

type chatResponse struct {
	Text   string          `json:"text"`
	Finish string          `json:"finish_reason"`
	Usage  selfserve.Usage `json:"usage"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	modelPath := flag.String("model", "", "model (default: the default model)")
	timeout := flag.Duration("timeout", 60*time.Second, "longest a request may run")
	flag.Parse()

	model, err := selfserve.Load(*modelPath)
	if err != nil {
		log.Fatal(err)
	}
	engine, err := selfserve.NewEngine(model, selfserve.EngineOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()

	http.HandleFunc("/chat", func(w http.ResponseWriter, r *http.Request) {
		var req chatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		stream, err := engine.Chat(ctx, req.Messages, selfserve.Request{MaxTokens: req.MaxTokens, Temperature: req.Temperature, Seed: -1})
		if err != nil {
			http.Error(w, err.Error(), status(err))
			return
		}
		flusher, _ := w.(http.Flusher)
		if req.Stream {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		var out chatResponse
		for {
			ev, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				if !req.Stream {
					http.Error(w, err.Error(), status(err))
				}
				return // streaming: the client sees the text end early (or has gone)
			}
			out.Text += ev.Text
			out.Usage = ev.Usage
			if ev.Finish != selfserve.FinishNone {
				out.Finish = ev.Finish.String()
			}
			if req.Stream && ev.Text != "" {
				io.WriteString(w, ev.Text)
				if flusher != nil {
					flusher.Flush()
				}
			}
		}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(out)
		}
	})
	http.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		m, err := engine.Metrics()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		json.NewEncoder(w).Encode(m)
	})
	log.Printf("serving chat on http://%s/chat (device %s)", *addr, engine.Device())
	log.Fatal(http.ListenAndServe(*addr, nil))
}

// status maps the SDK's error codes to HTTP.
func status(err error) int {
	switch {
	case errors.Is(err, selfserve.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, selfserve.ErrDeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, selfserve.ErrCancelled):
		return 499 // the client closed the request
	case errors.Is(err, selfserve.ErrOutOfMemory), errors.Is(err, selfserve.ErrClosed):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}
