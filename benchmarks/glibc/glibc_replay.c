/* Replays a malloc log (see malloc_log.c) through this machine's real glibc, touching every byte,
   and prints the peak RSS above the start: ground truth for trainmem's glibc model (alloc/cpu.py).
   usage: glibc_replay LOG [touch] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <malloc.h>
struct rec { char op; char pad[7]; uint64_t a, b, n, tid; };
typedef struct { uint64_t k; void* v; } ent;
#define H (1<<22)
static ent tab[H];
static void put(uint64_t k, void* v){ uint64_t h=(k*0x9E3779B97F4A7C15ull)>>42; while(tab[h].k && tab[h].k!=k) h=(h+1)&(H-1); tab[h].k=k; tab[h].v=v; }
static void* take(uint64_t k){ uint64_t h=(k*0x9E3779B97F4A7C15ull)>>42; while(tab[h].k){ if(tab[h].k==k){ void*v=tab[h].v; tab[h].k=1; tab[h].v=0; return v;} h=(h+1)&(H-1);} return 0; }
static long rss(){ FILE*f=fopen("/proc/self/statm","r"); long a,b; fscanf(f,"%ld %ld",&a,&b); fclose(f); return b*4096; }
int main(int c, char**v){ FILE*f=fopen(v[1],"rb"); struct rec r; memset(tab, 0, sizeof tab); /* resident before the baseline */
 long base=rss(), peak=0; int touch=c>2;
 while(fread(&r,sizeof r,1,f)==1){
  if(r.op=='r'){ void*o=take(r.b); void*p=realloc(o,r.n); if(p&&touch) memset(p,1,r.n); put(r.a,p); }
  else if(r.op=='m'){ void*p=malloc(r.n); if(touch) memset(p,1,r.n); put(r.a,p);} 
  else if(r.op=='a'){ void*p=0; posix_memalign(&p,r.b,r.n); if(touch) memset(p,1,r.n); put(r.a,p);} 
  else if(r.op=='f'){ void*p=take(r.a); if(p) free(p);} 
  long x=rss()-base; if(x>peak) peak=x; }
 struct mallinfo2 m=mallinfo2(); printf("peak rss above base %.1f MiB; arena %.1f mmap %.1f\n", peak/1048576.0, m.arena/1048576.0, m.hblkhd/1048576.0); }
