package kvevents

import "sort"

// AllStats calls f with what the Subscriber saw of each engine it follows,
// in name order (for the router's metrics).
func (s *Subscriber) AllStats(f func(name string, st EngineStats)) {
	s.mu.Lock()
	names := make([]string, 0, len(s.engines))
	for name := range s.engines {
		names = append(names, name)
	}
	s.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		if st, ok := s.Stats(name); ok {
			f(name, st)
		}
	}
}
