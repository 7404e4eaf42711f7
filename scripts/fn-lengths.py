#!/usr/bin/env python3
"""Function lengths of Rust sources: median, p90 and max, then the longest.

Usage: scripts/fn-lengths.py src [tests ...]   (TOP=N for how many to list)

A function is counted from its `fn` line to its closing brace, with comments
and string literals blanked first so their braces do not count."""
import os
import re
import statistics
import sys


def strip(src):
    # remove comments and strings crudely
    out=[];i=0;n=len(src)
    while i<n:
        c=src[i]
        if src.startswith('//',i):
            j=src.find('\n',i); j=n if j<0 else j; out.append(' '*(j-i)); i=j; continue
        if src.startswith('/*',i):
            j=src.find('*/',i)+2; seg=src[i:j]; out.append(re.sub(r'[^\n]',' ',seg)); i=j; continue
        m=re.match(r'r(#*)"',src[i:i+10])
        if m and (i==0 or not (src[i-1].isalnum() or src[i-1]=='_')):
            h=m.group(1); end='"'+h; j=src.find(end,i+len(m.group(0)))+len(end); seg=src[i:j]; out.append(re.sub(r'[^\n]',' ',seg)); i=j; continue
        if c=='"':
            j=i+1
            while j<n and src[j]!='"':
                j+= 2 if src[j]=='\\' else 1
            seg=src[i:j+1]; out.append(re.sub(r'[^\n]',' ',seg)); i=j+1; continue
        if c=="'" :
            m=re.match(r"'(\\.|[^\\'])'",src[i:i+6]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'",src[i:i+12])
            if m: out.append(' '*len(m.group(0))); i+=len(m.group(0)); continue
        out.append(c); i+=1
    return ''.join(out)
res=[]
for root in sys.argv[1:]:
  for dp,_,fs in os.walk(root):
    for f in fs:
      if not f.endswith('.rs'): continue
      p=os.path.join(dp,f); s=strip(open(p).read())
      for m in re.finditer(r'\bfn\s+(\w+)',s):
        j=m.end(); 
        # find first { or ; at depth 0 of parens
        d=0
        while j<len(s):
            ch=s[j]
            if ch in '(<[': d+=1
            elif ch in ')>]': d-=1
            elif ch==';' and d<=0: j=None; break
            elif ch=='{' and d<=0: break
            j+=1
        if j is None or j>=len(s): continue
        depth=0;k=j
        while k<len(s):
            if s[k]=='{': depth+=1
            elif s[k]=='}':
                depth-=1
                if depth==0: break
            k+=1
        a=s.count('\n',0,m.start())+1; b=s.count('\n',0,k)+1
        res.append((b-a+1,p,a,m.group(1)))
L=sorted(r[0] for r in res)
q=lambda p:L[min(len(L)-1,int(p*len(L)))]
print(f"n={len(L)} median={statistics.median(L)} p90={q(0.9)} max={L[-1]}")
for r in sorted(res,reverse=True)[:int(os.environ.get('TOP','15'))]: print(*r)
